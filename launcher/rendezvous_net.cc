// The rendezvous rounds over TCP (Note [elastic rendezvous] in launcher/rendezvous.cc): the server
// thread that serves a RoundTable and the one-request client.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "launcher/rendezvous.h"
#include "launcher/util.h"

namespace accel::launcher {

namespace {

constexpr size_t kMaxLine = 4096;
constexpr double kServerIoSeconds = 2.0;  // a client that stalls mid-request is dropped

double seconds_left(RdzvClock::time_point deadline) {
  return std::chrono::duration<double>(deadline - RdzvClock::now()).count();
}

// One '\n'-terminated line from fd before `deadline`; nullopt on timeout, EOF or an overlong line.
std::optional<std::string> read_line(int fd, RdzvClock::time_point deadline) {
  std::string line;
  char c = 0;
  while (line.size() < kMaxLine) {
    const double left = seconds_left(deadline);
    if (left <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return std::nullopt;
    const ssize_t got = ::recv(fd, &c, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return std::nullopt;
    if (c == '\n') return line;
    line.push_back(c);
  }
  return std::nullopt;
}

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

bool proof_matches(const std::string& token, const std::string& message, const std::string& got) {
  const std::string want = rendezvous_proof(token, message);
  return got.size() == want.size() && CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0;
}

std::string peer_address(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  else
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  return buf;
}

}  // namespace

std::string rendezvous_proof(const std::string& token, const std::string& message) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ACCEL_CHECK(HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
                   reinterpret_cast<const unsigned char*>(message.data()), message.size(), md,
                   &len) != nullptr,
              DistError, "rendezvous", "HMAC-SHA256 failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::unique_ptr<RendezvousServer> RendezvousServer::try_start(const std::string& addr, int port,
                                                              const std::string& token,
                                                              RendezvousLimits limits) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return nullptr;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      close(fd);
      fd = -1;
    } else {
      sockaddr_storage ss{};
      std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
      limits.host_addr = peer_address(ss);
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return nullptr;
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(fd, token, limits));
}

RendezvousServer::RendezvousServer(int fd, std::string token, RendezvousLimits limits)
    : fd_(fd), token_(std::move(token)), table_(limits) {
  thread_ = std::thread([this] { serve(); });
}

RendezvousServer::~RendezvousServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

bool RendezvousServer::all_done() {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.all_done();
}

// Requests are served one at a time: each is one short line, and a client gets at most
// kServerIoSeconds to send it.
void RendezvousServer::serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, 100);
    {
      std::lock_guard<std::mutex> lock(mu_);
      table_.tick(RdzvClock::now());
    }
    if (rc <= 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int c = accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (c < 0) continue;
    answer(c, peer_address(ss));
    close(c);
  }
}

void RendezvousServer::answer(int fd, const std::string& peer) {
  const std::string nonce = random_hex(16);
  if (!write_all(fd, "accel-rdzv 1 " + nonce + "\n")) return;
  const auto deadline = RdzvClock::now() + std::chrono::duration_cast<RdzvClock::duration>(
                                               std::chrono::duration<double>(kServerIoSeconds));
  const auto line = read_line(fd, deadline);
  if (!line) return;
  const auto sp = line->find(' ');
  if (sp == std::string::npos) return;
  const std::string request = line->substr(sp + 1);
  std::string reply;
  if (!proof_matches(token_, "req|" + nonce + "|" + request, line->substr(0, sp))) {
    reply =
        "refused the request does not prove the rendezvous token (ACCEL_RENDEZVOUS_TOKEN "
        "differs from the serving agent's)";
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    reply = table_.handle(request, peer, RdzvClock::now());
  }
  write_all(fd, rendezvous_proof(token_, "rep|" + nonce + "|" + reply) + " " + reply + "\n");
}

namespace {
// One attempt; empty on a connection failure (the caller retries), throws on a bad answer.
std::string request_once(const std::string& addr, int port, const std::string& token,
                         const std::string& request, RdzvClock::time_point deadline,
                         std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int g = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (g != 0) {
    *error = gai_strerror(g);
    return {};
  }
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      *error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return {};
  std::string reply;
  const auto hello = read_line(fd, deadline);
  const std::string prefix = "accel-rdzv 1 ";
  if (hello && hello->rfind(prefix, 0) == 0) {
    const std::string nonce = hello->substr(prefix.size());
    const auto line = write_all(fd, rendezvous_proof(token, "req|" + nonce + "|" + request) + " " +
                                        request + "\n")
                          ? read_line(fd, deadline)
                          : std::nullopt;
    const auto sp = line ? line->find(' ') : std::string::npos;
    if (sp != std::string::npos) {
      reply = line->substr(sp + 1);
      ACCEL_CHECK(proof_matches(token, "rep|" + nonce + "|" + reply, line->substr(0, sp)),
                  DistError, "rendezvous", "the server at ", addr, ":", port,
                  " does not prove the rendezvous token: it is not this job's");
    } else {
      *error = "no reply";
    }
  } else {
    *error = "no rendezvous greeting (is another service on this port?)";
  }
  close(fd);
  return reply;
}
}  // namespace

std::string rendezvous_request(const std::string& addr, int port, const std::string& token,
                               const std::string& request, double timeout_s) {
  const auto deadline = RdzvClock::now() + std::chrono::duration_cast<RdzvClock::duration>(
                                               std::chrono::duration<double>(timeout_s));
  std::string error = "timed out";
  while (seconds_left(deadline) > 0) {
    std::string reply = request_once(addr, port, token, request, deadline, &error);
    if (!reply.empty()) return reply;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ACCEL_THROW(DistError, "rendezvous", "no answer from the rendezvous server at ", addr, ":", port,
              " within ", timeout_s, " s (", error, ") to '", request, "'");
}

}  // namespace accel::launcher
