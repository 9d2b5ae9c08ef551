#include "launcher/util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace accel::launcher {

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::optional<std::string> env_get(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> make_environ(const EnvMap& base, const EnvMap& vars) {
  EnvMap merged = base;
  for (const auto& [k, v] : vars) merged[k] = v;
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [k, v] : merged) out.push_back(k + "=" + v);
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.emplace_back(
        s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::optional<long long> parse_int(std::string_view s) {
  std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  const char* b = t.data();
  if (*b == '+') ++b;
  long long v = 0;
  auto [p, ec] = std::from_chars(b, t.data() + t.size(), v);
  if (ec != std::errc() || p != t.data() + t.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view s) {
  std::string t = trim(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  if (errno != 0 || end != t.c_str() + t.size()) return std::nullopt;
  return v;
}

std::optional<std::string> check_number(double v, double lo, double hi, bool lo_open) {
  auto num = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  std::string range(1, lo_open ? '(' : '[');
  range += num(lo);
  range += ", ";
  range += num(hi);
  range += ']';
  if (std::isnan(v)) return "expected a number in " + range + ", got nan";
  if (std::isinf(v)) return "expected a finite number in " + range + ", got " + num(v);
  if (lo_open ? !(v > lo) : !(v >= lo)) return "expected a number in " + range + ", got " + num(v);
  if (!(v <= hi)) return "expected a number in " + range + ", got " + num(v);
  return std::nullopt;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(addr.c_str(), "0", &hints, &res);
  ACCEL_CHECK(rc == 0, DistError, "accel-run", "cannot resolve main_process_ip '", addr,
              "' to pick a free port: ", gai_strerror(rc));
  int port = -1;
  std::string last_error;
  for (addrinfo* ai = res; ai != nullptr && port < 0; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
        port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      }
    } else {
      last_error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  ACCEL_CHECK(port > 0, DistError, "accel-run", "cannot bind to main_process_ip '", addr,
              "' to pick a free port: ", last_error,
              " (is it an address of this machine? pass --main_process_port to skip the pick)");
  return port;
}

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string self_exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return p.parent_path().string();
}

namespace {

struct SignalEntry {
  int number;
  const char* name;
};

// Names as kill -l prints them; the table serves both directions.
constexpr SignalEntry kSignals[] = {
    {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},   {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"},     {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},     {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"},     {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"},   {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},   {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"},     {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},   {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"},     {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGPWR, "SIGPWR"},
    {SIGSYS, "SIGSYS"},
};

}  // namespace

std::string signal_name(int sig) {
  for (const auto& e : kSignals) {
    if (e.number == sig) return e.name;
  }
  return "signal " + std::to_string(sig);
}

std::optional<int> parse_signal(std::string_view s) {
  std::string t = trim(s);
  if (auto n = parse_int(t)) {
    for (const auto& e : kSignals) {
      if (e.number == *n) return e.number;
    }
    return std::nullopt;
  }
  for (char& c : t) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t.rfind("SIG", 0) != 0) t = "SIG" + t;
  for (const auto& e : kSignals) {
    if (t == e.name) return e.number;
  }
  return std::nullopt;
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    ACCEL_CHECK(n > 0, IoError, "accel-run", "getrandom failed: ", std::strerror(errno),
                " (no randomness for a rendezvous token or launch id)");
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char b : raw) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown";
  return buf;
}

}  // namespace accel::launcher
