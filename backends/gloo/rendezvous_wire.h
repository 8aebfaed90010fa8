// Pieces of the rendezvous wire protocol, version 2 (backends/gloo/rendezvous_client.h and
// launcher/tuttirun_lib/rendezvous.py describe it), shared by libtutti's client and its
// in-process server: sizes, codes, little-endian integers, the HMAC and the signed frames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti {
namespace detail {

constexpr char kRendezvousVersion = 2;
constexpr size_t kRendezvousNonceBytes = 16;
constexpr size_t kRendezvousHelloBytes = 21;          // "TUTH", version, 16-byte nonce
constexpr size_t kRendezvousProofBytes = 36;          // "TUTC", HMAC of the nonce
constexpr size_t kRendezvousRequestHeaderBytes = 32;  // "TUTQ" op 3x0 seq timeout klen vlen
constexpr size_t kRendezvousResponseHeaderBytes = 24; // "TUTA" status 3x0 seq length
constexpr size_t kRendezvousMacBytes = 32;
constexpr uint64_t kRendezvousMaxWaitMs = 24ull * 3600 * 1000;

enum RendezvousOp : uint8_t { kRdzvSet = 1, kRdzvGet = 2, kRdzvWait = 3, kRdzvAdd = 4 };
enum RendezvousStatus : uint8_t {
  kRdzvOk = 0,
  kRdzvTimedOut = 1,
  kRdzvBadRequest = 2,
  kRdzvUnauthenticated = 3,
  kRdzvBusy = 4
};

void putLittleEndian(std::string& out, uint64_t value, int bytes);
uint64_t getLittleEndian(const char* in, int bytes);
// HMAC-SHA256(secret, data); throws Error(kInternal) if OpenSSL fails.
std::string hmacSha256(const std::string& secret, const std::string& data);
// Compares two MACs in constant time.
bool macEqual(const std::string& a, const std::string& b);

// The client's first message (step 2): "TUTC" and the HMAC of the connection's nonce.
std::string rendezvousProof(const std::string& secret, const std::string& nonce);
// A whole signed request (step 4): header, key, value, HMAC.
std::string rendezvousRequest(const std::string& secret, const std::string& nonce, uint8_t op,
                              uint64_t seq, uint32_t timeout_ms, const std::string& key,
                              const std::string& value);
// A whole signed response (step 5): header, payload, HMAC.
std::string rendezvousResponse(const std::string& secret, const std::string& nonce,
                               uint8_t status, uint64_t seq, const std::string& payload);

}  // namespace detail
}  // namespace tutti
