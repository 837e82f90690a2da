// The project's one set of Status helper macros (abseil 20220623 ships none).
//
//   LK_RETURN_IF_ERROR(DoThing());          returns the Status when it is not OK
//   LK_ASSIGN_OR_RETURN(auto x, MakeX());   unwraps a StatusOr or returns its Status
#ifndef LATCHKEY_COMMON_STATUS_MACROS_H_
#define LATCHKEY_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LK_RETURN_IF_ERROR(expr)              \
  do {                                        \
    const ::absl::Status lk_status_ = (expr); \
    if (!lk_status_.ok()) return lk_status_;  \
  } while (0)

#define LK_STATUS_CONCAT_INNER_(a, b) a##b
#define LK_STATUS_CONCAT_(a, b) LK_STATUS_CONCAT_INNER_(a, b)
#define LK_ASSIGN_OR_RETURN(lhs, expr) \
  LK_ASSIGN_OR_RETURN_IMPL_(LK_STATUS_CONCAT_(lk_statusor_, __LINE__), lhs, expr)
#define LK_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                              \
  if (!var.ok()) return var.status();             \
  lhs = *std::move(var)

#endif  // LATCHKEY_COMMON_STATUS_MACROS_H_
