// The launcher/worker environment contract (torchrun-compatible).
//
//   RANK, WORLD_SIZE            global rank and number of processes
//   LOCAL_RANK, LOCAL_WORLD_SIZE rank and process count on this host
//   MASTER_ADDR, MASTER_PORT    where rank 0 serves the rendezvous store
//   ACCEL_RENDEZVOUS_TOKEN      optional shared secret a store client must present
//
// With none of RANK / WORLD_SIZE set the program is a single process (rank 0 of 1) and every
// distributed entry point still works.
#pragma once

#include <string>

namespace accel::dist {

constexpr const char* kDefaultMasterAddr = "127.0.0.1";
constexpr int kDefaultMasterPort = 29500;

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = kDefaultMasterAddr;
  int master_port = kDefaultMasterPort;
  std::string token;         // ACCEL_RENDEZVOUS_TOKEN, empty when unset
  bool distributed = false;  // true when RANK/WORLD_SIZE were given
};

// Reads and validates the variables. Throws DistError naming the variable on a malformed or
// inconsistent value (RANK without WORLD_SIZE, RANK >= WORLD_SIZE, a port outside 1..65535, ...).
DistEnv read_dist_env();

// Strict integer parse of an environment value; `name` is used in the error message.
int parse_env_int(const char* name, const std::string& value, int lo, int hi);

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_address(const std::string& addr);

}  // namespace accel::dist
