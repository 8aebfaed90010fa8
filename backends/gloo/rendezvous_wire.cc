#include "backends/gloo/rendezvous_wire.h"

#include "base/common.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace tutti {
namespace detail {

void putLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t getLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(in[i]);
  return value;
}

std::string hmacSha256(const std::string& secret, const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len))
    throwError(StatusCode::kInternal, "rendezvous: HMAC-SHA256 failed in OpenSSL");
  return std::string(reinterpret_cast<char*>(md), len);
}

bool macEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string rendezvousProof(const std::string& secret, const std::string& nonce) {
  return "TUTC" + hmacSha256(secret, "tutti-rdzv-auth" + nonce);
}

std::string rendezvousRequest(const std::string& secret, const std::string& nonce, uint8_t op,
                              uint64_t seq, uint32_t timeout_ms, const std::string& key,
                              const std::string& value) {
  std::string frame = "TUTQ";
  frame.push_back(static_cast<char>(op));
  frame.append(3, '\0');
  putLittleEndian(frame, seq, 8);
  putLittleEndian(frame, timeout_ms, 4);
  putLittleEndian(frame, key.size(), 4);
  putLittleEndian(frame, value.size(), 8);
  frame += key;
  frame += value;
  return frame + hmacSha256(secret, "tutti-rdzv-req" + nonce + frame);
}

std::string rendezvousResponse(const std::string& secret, const std::string& nonce,
                               uint8_t status, uint64_t seq, const std::string& payload) {
  std::string header = "TUTA";
  header.push_back(static_cast<char>(status));
  header.append(3, '\0');
  putLittleEndian(header, seq, 8);
  putLittleEndian(header, payload.size(), 8);
  return header + payload + hmacSha256(secret, "tutti-rdzv-resp" + nonce + header + payload);
}

}  // namespace detail
}  // namespace tutti
