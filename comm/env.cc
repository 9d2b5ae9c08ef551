#include "comm/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/env_contract.h"
#include "core/error.h"

namespace accel::dist {

namespace {
const char* getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}
}  // namespace

int parse_env_int(const char* name, const std::string& value, int lo, int hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  ACCEL_CHECK(!value.empty() && errno == 0 && end && *end == '\0', DistError, "dist.env", name,
              "='", value, "' is not an integer");
  ACCEL_CHECK(v >= lo && v <= hi, DistError, "dist.env", name, "=", v, " is outside [", lo, ", ",
              hi, "]");
  return int(v);
}

bool is_loopback_address(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr == "[::1]" || addr.rfind("127.", 0) == 0;
}

DistEnv read_dist_env() {
  DistEnv env;
  const char* rank = getenv_nonempty(env::kRank);
  const char* world = getenv_nonempty(env::kWorldSize);
  ACCEL_CHECK(bool(rank) == bool(world), DistError, "dist.env",
              "RANK and WORLD_SIZE must be set together (RANK=", rank ? rank : "<unset>",
              ", WORLD_SIZE=", world ? world : "<unset>", ")");
  constexpr int kMaxWorld = 1 << 20;
  if (world) {
    env.world_size = parse_env_int(env::kWorldSize, world, 1, kMaxWorld);
    env.rank = parse_env_int(env::kRank, rank, 0, env.world_size - 1);
    env.distributed = true;
  }
  // Without LOCAL_* all ranks are assumed to share one host (LOCAL_RANK = RANK), as torchrun
  // does for a single node.
  env.local_world_size = env.world_size;
  env.local_rank = env.rank;
  if (const char* lws = getenv_nonempty(env::kLocalWorldSize)) {
    env.local_world_size = parse_env_int(env::kLocalWorldSize, lws, 1, env.world_size);
  }
  if (const char* lr = getenv_nonempty(env::kLocalRank)) {
    env.local_rank = parse_env_int(env::kLocalRank, lr, 0, env.local_world_size - 1);
  } else {
    env.local_rank = env.rank % env.local_world_size;
  }
  ACCEL_CHECK(env.local_rank < env.local_world_size, DistError, "dist.env",
              "LOCAL_RANK=", env.local_rank, " must be < LOCAL_WORLD_SIZE=", env.local_world_size,
              " (set LOCAL_WORLD_SIZE when LOCAL_RANK differs from RANK)");
  if (const char* addr = getenv_nonempty(env::kMasterAddr)) env.master_addr = addr;
  if (const char* port = getenv_nonempty(env::kMasterPort)) {
    env.master_port = parse_env_int(env::kMasterPort, port, 1, 65535);
  }
  if (const char* tok = std::getenv(env::kRendezvousToken)) env.token = tok;
  return env;
}

}  // namespace accel::dist
