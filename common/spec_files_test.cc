// CheckSpecFiles on a Megatron dataset: the P.idx and P.bin of path_prefix and of every blend
// entry, and the index cache folder, each refusal naming its field, the path and the reason.
#include "common/spec_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

using json = nlohmann::json;
using ::latchkey::testing::ScopedTempDir;

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

json Spec(const json& data) {
  json j = json::parse(R"json(
{"model": {"model_type": "gpt_bigcode", "n_layer": 1, "n_embd": 32, "n_head": 4,
           "vocab_size": 256, "n_positions": 64},
 "train_micro_batch_size_per_gpu": 1,
 "latchkey": {"seq_len": 16, "steps": 4}})json");
  j["latchkey"]["data"] = data;
  return j;
}

absl::Status Check(const json& j, const std::string& dir) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(j.dump(), dir);
  if (!spec.ok()) return spec.status();
  return CheckSpecFiles(*spec);
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(SpecFiles, AMegatronDatasetNeedsItsIdxAndBin) {
  const ScopedTempDir dir("spec-files-megatron");
  const json one = Spec({{"format", "megatron"}, {"path_prefix", "corpus"}});
  absl::Status st = Check(one, dir.path());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(st), "latchkey.data.path_prefix: cannot read '" + dir / "corpus.idx" +
                         "': No such file or directory");
  Touch(dir / "corpus.idx");
  EXPECT_EQ(Msg(Check(one, dir.path())), "latchkey.data.path_prefix: cannot read '" +
                                             dir / "corpus.bin" + "': No such file or directory");
  Touch(dir / "corpus.bin");
  EXPECT_TRUE(Check(one, dir.path()).ok()) << Check(one, dir.path());
  // A folder where the file should be.
  ASSERT_EQ(mkdir((dir / "folder.idx").c_str(), 0755), 0);
  Touch(dir / "folder.bin");
  EXPECT_EQ(Msg(Check(Spec({{"format", "megatron"}, {"path_prefix", "folder"}}), dir.path())),
            "latchkey.data.path_prefix: cannot read '" + dir / "folder.idx" +
                "': it is a folder, not a file");

  // Every blend entry, named by its index.
  const json blend = Spec({{"format", "megatron"},
                           {"blend",
                            {{{"weight", 0.7}, {"path_prefix", "corpus"}},
                             {{"weight", 0.3}, {"path_prefix", "other"}}}}});
  EXPECT_EQ(Msg(Check(blend, dir.path())), "latchkey.data.blend[1].path_prefix: cannot read '" +
                                               dir / "other.idx" + "': No such file or directory");
  Touch(dir / "other.idx");
  Touch(dir / "other.bin");
  EXPECT_TRUE(Check(blend, dir.path()).ok());
  // The eval split reads the same dataset: no file of its own.
  json with_eval = one;
  with_eval["latchkey"]["data"]["split"] = "90,10,0";
  with_eval["latchkey"]["eval"] = {{"split", "validation"}, {"every_steps", 2}, {"samples", 2}};
  EXPECT_TRUE(Check(with_eval, dir.path()).ok());
}

TEST(SpecFiles, TheIndexCacheFolderMustBeWritable) {
  const ScopedTempDir dir("spec-files-cache");
  Touch(dir / "corpus.idx");
  Touch(dir / "corpus.bin");
  Touch(dir / "a-file");
  const auto with_cache = [&](const std::string& cache_dir) {
    return Spec({{"format", "megatron"}, {"path_prefix", "corpus"}, {"cache_dir", cache_dir}});
  };
  // The default: beside the data, whose folder is writable.
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(Spec({{"format", "megatron"}, {"path_prefix", "corpus"}}).dump(), dir.path());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(MegatronCacheDir(*spec), dir / "latchkey-index-cache");
  EXPECT_TRUE(CheckSpecFiles(*spec).ok());
  // A folder not made yet is made by the workers: fine when it can be.
  EXPECT_TRUE(Check(with_cache("new/deeper"), dir.path()).ok());
  EXPECT_EQ(Msg(Check(with_cache("a-file"), dir.path())),
            "latchkey.data.cache_dir: cannot write '" + dir / "a-file" + "': it is not a folder");
  EXPECT_EQ(Msg(Check(with_cache("a-file/sub"), dir.path())),
            "latchkey.data.cache_dir: cannot write '" + dir / "a-file/sub" + "': '" +
                dir / "a-file" + "' is not a folder");
  if (geteuid() != 0) {  // root writes anywhere
    ASSERT_EQ(mkdir((dir / "locked").c_str(), 0555), 0);
    EXPECT_EQ(Msg(Check(with_cache("locked"), dir.path())),
              "latchkey.data.cache_dir: cannot write '" + dir / "locked" + "': Permission denied");
    EXPECT_EQ(Msg(Check(with_cache("locked/sub"), dir.path())),
              "latchkey.data.cache_dir: cannot write '" + dir / "locked/sub" +
                  "': cannot create it in '" + dir / "locked" + "': Permission denied");
  }
}

}  // namespace
}  // namespace latchkey
