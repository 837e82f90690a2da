#include "worker/checkpoint/files.h"

#include <errno.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(FilesTest, WriteFileAtomicallyOverwritesAndLeavesNoTemporaryFile) {
  const testing::ScopedTempDir tmp_dir("checkpoint-files");
  const std::string dir = tmp_dir.path();
  ASSERT_TRUE(WriteFileAtomically(dir + "/x", "first").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/x", "second").ok());
  absl::StatusOr<std::string> back = ReadWholeFile(dir + "/x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, "second");
  ASSERT_TRUE(WriteFileAtomically(dir + "/empty", "").ok());
  EXPECT_EQ(*ReadWholeFile(dir + "/empty"), "");
  // Only the two files: every temporary file was renamed away.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_THAT(e.path().filename().string(), ::testing::AnyOf("x", "empty"));
  }
  EXPECT_EQ(entries, 2);
}

TEST(FilesTest, ErrorsNameThePath) {
  const testing::ScopedTempDir tmp_dir("checkpoint-files");
  const std::string dir = tmp_dir.path();
  absl::Status w = WriteFileAtomically(dir + "/missing/sub/x", "abc");
  EXPECT_EQ(w.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(w), HasSubstr(dir + "/missing/sub/x"));

  absl::StatusOr<std::string> r = ReadWholeFile(dir + "/nope");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(r.status()), HasSubstr(dir + "/nope"));
  r = ReadWholeFile(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("is a directory"));
}

TEST(FilesTest, FailedRenameRemovesTheTemporaryFile) {
  const testing::ScopedTempDir tmp_dir("checkpoint-files");
  const std::string dir = tmp_dir.path();
  // A non-empty directory cannot be replaced by a file.
  fs::create_directories(dir + "/taken/inner");
  absl::Status w = WriteFileAtomically(dir + "/taken", "abc");
  EXPECT_FALSE(w.ok());
  EXPECT_THAT(Msg(w), HasSubstr("cannot rename"));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(e.path().filename().string(), "taken");
  }
  EXPECT_EQ(entries, 1);
  EXPECT_TRUE(fs::is_directory(dir + "/taken/inner"));
}

TEST(FilesTest, PathKindsAndDirectories) {
  const testing::ScopedTempDir tmp_dir("checkpoint-files");
  const std::string dir = tmp_dir.path();
  EXPECT_EQ(*GetPathKind(dir), PathKind::kDirectory);
  EXPECT_EQ(*GetPathKind(dir + "/none"), PathKind::kMissing);
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "1").ok());
  EXPECT_EQ(*GetPathKind(dir + "/f"), PathKind::kFile);
  EXPECT_TRUE(IsRegularFile(dir + "/f"));
  EXPECT_FALSE(IsRegularFile(dir));
  EXPECT_FALSE(IsRegularFile(dir + "/none"));
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(*GetPathKind(dir + "/fifo"), PathKind::kOther);
  // A path through a file is an error, not "missing".
  EXPECT_FALSE(GetPathKind(dir + "/f/sub").ok());

  ASSERT_TRUE(CreateDirectories(dir + "/a/b/c").ok());
  EXPECT_TRUE(fs::is_directory(dir + "/a/b/c"));
  EXPECT_TRUE(CreateDirectories(dir + "/a/b/c").ok());  // already there
  absl::Status s = CreateDirectories(dir + "/f/sub");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Msg(s), HasSubstr("cannot create directory " + dir + "/f/sub"));
}

TEST(FilesTest, AFullDiskIsToldFromOtherErrorsByItsErrno) {
  const testing::ScopedTempDir tmp_dir("checkpoint-files");
  const std::string dir = tmp_dir.path();
  EXPECT_TRUE(IsOutOfSpace(WithErrno(absl::InternalError("x"), ENOSPC)));
  EXPECT_TRUE(IsOutOfSpace(WithErrno(absl::InternalError("x"), EDQUOT)));
  EXPECT_TRUE(IsOutOfSpace(WithErrno(absl::InternalError("x"), EFBIG)));
  EXPECT_FALSE(IsOutOfSpace(WithErrno(absl::InternalError("x"), EIO)));
  EXPECT_FALSE(IsOutOfSpace(absl::InternalError("No space left on device")));  // text alone
  EXPECT_TRUE(WithErrno(absl::OkStatus(), ENOSPC).ok());
  EXPECT_EQ(StatusErrno(absl::InternalError("x")), 0);
  // The OS errors of this file carry their errno.
  absl::StatusOr<std::string> missing = ReadWholeFile(dir + "/missing");
  EXPECT_EQ(StatusErrno(missing.status()), ENOENT);
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "x").ok());
  EXPECT_EQ(StatusErrno(CreateDirectories(dir + "/f/sub")), ENOTDIR);
}

TEST(FilesTest, RemovesAFileOrAnEmptyFolderThatMayBeGone) {
  const testing::ScopedTempDir tmp_dir("checkpoint-files");
  const std::string dir = tmp_dir.path();
  ASSERT_TRUE(CreateDirectories(dir + "/d").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/d/f", "x").ok());
  absl::Status not_empty = RemoveEmptyDirIfPresent(dir + "/d");
  EXPECT_FALSE(not_empty.ok());
  EXPECT_THAT(Msg(not_empty), HasSubstr(dir + "/d"));
  EXPECT_TRUE(RemoveFileIfPresent(dir + "/d/f").ok());
  EXPECT_TRUE(RemoveFileIfPresent(dir + "/d/f").ok());  // already gone
  EXPECT_TRUE(RemoveEmptyDirIfPresent(dir + "/d").ok());
  EXPECT_TRUE(RemoveEmptyDirIfPresent(dir + "/d").ok());  // already gone
  EXPECT_FALSE(fs::exists(dir + "/d"));
}

TEST(FilesTest, JoinPath) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
}

}  // namespace
}  // namespace latchkey
