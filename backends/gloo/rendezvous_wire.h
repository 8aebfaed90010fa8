// Pieces of the rendezvous wire protocol (backends/gloo/rendezvous_client.h describes it)
// that the in-process server needs: little-endian integers and the HMAC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti {
namespace detail {

constexpr size_t kRendezvousHelloBytes = 21;          // "TUTH", version 1, 16-byte nonce
constexpr size_t kRendezvousRequestHeaderBytes = 32;  // "TUTQ" op 3x0 seq timeout klen vlen
constexpr size_t kRendezvousResponseHeaderBytes = 24; // "TUTA" status 3x0 seq length
constexpr size_t kRendezvousMacBytes = 32;
constexpr uint64_t kRendezvousMaxWaitMs = 24ull * 3600 * 1000;

enum RendezvousOp : uint8_t { kRdzvSet = 1, kRdzvGet = 2, kRdzvWait = 3, kRdzvAdd = 4 };
enum RendezvousStatus : uint8_t {
  kRdzvOk = 0,
  kRdzvTimedOut = 1,
  kRdzvBadRequest = 2,
  kRdzvUnauthenticated = 3
};

void putLittleEndian(std::string& out, uint64_t value, int bytes);
uint64_t getLittleEndian(const char* in, int bytes);
// HMAC-SHA256(secret, data); throws Error(kInternal) if OpenSSL fails.
std::string hmacSha256(const std::string& secret, const std::string& data);
// Compares two MACs in constant time.
bool macEqual(const std::string& a, const std::string& b);

}  // namespace detail
}  // namespace tutti
