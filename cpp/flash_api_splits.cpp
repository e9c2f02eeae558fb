// Host API, the split-KV heuristics: num_splits_heuristic, for the KV kernel, the Hopper
// forward and (decode_num_splits) the decode kernel.
#include "flash_api.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "flash_api_internal.h"
#include "sm80/decode_config.h"
#include "sm80/fwd_config.h"
#include "sm90/fwd_config.h"
#include "common/launch.h"

namespace flashattn2 {
namespace {

// Shared memory per SM of `device` in bytes (cached).
int smem_per_sm(int device) {
  static std::array<std::atomic<int>, kMaxDevices> bytes{};
  int n = bytes[device].load(std::memory_order_relaxed);
  if (n == 0) {
    check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
               "cudaDeviceGetAttribute(maxSharedMemoryPerMultiprocessor)");
    bytes[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Decode CTAs of `warps` warps an SM holds at once: shared memory (1 KiB reserved per CTA),
// at most decode_ctas_per_sm (the kernel's __launch_bounds__): 4 warps H100 / H200 2 at d128,
// 3 at d64, A100 1 / 2; 2 warps twice as many.
int decode_resident(int kd, int device, int warps = kDecodeWarps) {
  return std::max(1, std::min(decode_ctas_per_sm(kd, warps),
                              smem_per_sm(device) / (decode_smem_bytes(kd, warps) + 1024)));
}

// Decode CTAs an SM needs for 64 KiB of K/V in flight (each keeps 4 warps x (kStages - 1)
// tiles in flight: d128 64 KiB, d64 48 KiB), which already read at 96-99 % of the floor (b16
// 8k-32k d128, one CTA an SM, on an H200); at most `resident`.
int decode_flight_ctas(int kd, int resident) {
  constexpr int kFlightBytes = 64 * 1024;
  const int cta_flight = kDecodeWarps * (decode_stages(kd) - 1) * 2 * kDecodeBlockN * kd * 2;
  return std::min(resident, (kFlightBytes + cta_flight - 1) / cta_flight);
}

// Split count of the decode kernel for `groups` CTAs per split (batch x KV-head groups), by
// the bytes each SM keeps in flight (decode_flight_ctas): the fewest splits whose CTAs give
// the SMs 64 KiB each (d128: one CTA an SM, d64: two) within 95 % of the best fill, never more
// CTAs than the SMs hold at once (a second wave starts late), with at least one 16-key tile
// per warp per split. More splits only add partials and the merge's reads: two CTAs an SM at
// d128 (the rule until the thirty-third session) took b1 32k 42.5 us against 40.5 with half
// the splits, b4 32k 130.0 against 127.1 (H200; cuDNN 40.2, 126.1). And no split where the
// unsplit grid already gives 90 % of the SMs a CTA (b16 x 8 KV heads = 128 CTAs on 132 SMs):
// no partials and no merge (b16 1k: 2 splits + merge took 35.2 us on an H100, cuDNN 28.8;
// 27.2 against 23.4 unsplit on an H200).
int decode_num_splits(int64_t groups, int batch, int seqlen_k, int kd, int device) {
  const int64_t sms = sm_count(device);
  if (groups * 10 >= sms * 9) return 1;
  const int resident = decode_resident(kd, device);
  const int64_t want = sms * decode_flight_ctas(kd, resident);
  const int64_t slots = sms * resident;
  const int n_tiles = (seqlen_k + kDecodeBlockN - 1) / kDecodeBlockN;
  const int max_splits =
      std::max(1, std::min({kMaxSplits, n_tiles / kDecodeMinTilesPerSplit, 65535 / batch}));
  auto fill = [&](int s) { return double(std::min(groups * s, want)) / double(want); };
  double best = 0.0;
  for (int s = 1; s <= max_splits && groups * s <= slots; ++s) best = std::max(best, fill(s));
  for (int s = 1; s <= max_splits && groups * s <= slots; ++s) {
    if (fill(s) >= 0.95 * best) return s;
  }
  return 1;
}

}  // namespace

int num_splits_heuristic(int batch, int nheads, int seqlen_q, int seqlen_k, int headdim,
                         int device, bool sm90, bool decode) {
  const int kd = kernel_head_dim(headdim);
  require(kd > 0, "no kernel for head dim " + std::to_string(headdim));
  require(device >= 0 && device < kMaxDevices, "bad device index " + std::to_string(device));
  require(batch > 0 && nheads > 0 && seqlen_q > 0 && seqlen_k > 0, "sizes must be positive");
  if (decode && !sm90 && seqlen_q <= kDecodeRows && DecodeHeadDims::dispatch(kd, [](auto) {}) &&
      max_smem_per_block(device) >= decode_smem_bytes(kd)) {
    return decode_num_splits(int64_t(batch) * nheads, batch, seqlen_k, kd, device);
  }
  // The tile of the kernel that runs (the sm90 forward's, one CTA per SM; or the KV
  // kernel's) and its CTAs resident per SM from the register and shared-memory budget.
  int block_m = 0, block_n = 0, per_sm = 1;
  if (sm90) {
    block_m = sm90_fwd_tile(kd).block_m;
    block_n = sm90_fwd_tile(kd).block_n;
  } else {
    const FwdTile tile = fwd_tile(kd, true);
    block_m = tile.block_m;
    block_n = tile.block_n;
    per_sm = std::max(1, std::min(tile.min_blocks, (227 * 1024) / fwd_smem_bytes(kd, true)));
  }
  const int64_t slots = int64_t(sm_count(device)) * per_sm;
  const int64_t ctas = int64_t(batch) * nheads * ((seqlen_q + block_m - 1) / block_m);
  const int n_blocks = (seqlen_k + block_n - 1) / block_n;
  if (ctas * 5 >= slots * 4) return 1;  // >= 80 % of the resident slots filled already
  // Wave efficiency of s splits: CTAs / (waves * slots). Take the fewest splits within 85 %
  // of the best (each extra split costs partial-result traffic and combine work); a split
  // count that leaves some split without a tile is not a candidate.
  const int max_splits = std::min({kMaxSplits, n_blocks, 65535 / batch});
  auto efficiency = [&](int s) {
    const double waves = double(ctas * s) / double(slots);
    return waves / std::ceil(waves);
  };
  auto usable = [&](int s) {
    const int per_split = (n_blocks + s - 1) / s;
    return s == 1 || (s - 1) * per_split < n_blocks;
  };
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    if (usable(s)) best = std::max(best, efficiency(s));
  }
  for (int s = 1; s <= max_splits; ++s) {
    if (usable(s) && efficiency(s) >= 0.85 * best) return s;
  }
  return 1;
}

// How the decode kernel runs a grid of `ctas` CTAs. 4-warp CTAs with their own shared memory
// where the SMs hold the grid at once. Else 2-warp CTAs where the SMs hold those at once (twice
// as many an SM, the same bytes in flight: one wave, not a second that starts late). Else
// 4-warp CTAs with shared memory padded so that an SM holds r of them, r the residency whose waves
// keep the most bytes in flight (decode_flight_ctas' 64 KiB an SM; a wave of fewer CTAs reads
// at that fraction of the speed), the most CTAs on a tie. d64 b64 (512 CTAs, 3 an SM): 1.29
// waves, the last 116 CTAs at 48 KiB an SM on 116 SMs, 76-81 % of the floor (thirty-third
// session, H200); 2 an SM make 1.94 waves. d128 b48: 2 or 1 an SM tie, so its own.
DecodeLaunch decode_launch(int64_t ctas, int kd, int device) {
  const int64_t sms = sm_count(device);
  const int own = decode_smem_bytes(kd);
  const int resident = decode_resident(kd, device);
  if (ctas <= sms * resident) return {kDecodeWarps, own};
  if (ctas <= sms * decode_resident(kd, device, kDecodeSmallWarps)) {
    return {kDecodeSmallWarps, decode_smem_bytes(kd, kDecodeSmallWarps)};
  }
  const double want = double(sms * decode_flight_ctas(kd, resident));
  int best_r = resident;
  double best_time = 0.0;
  for (int r = resident; r >= 1; --r) {  // time in units of the work at full speed
    const int64_t wave = sms * r;
    const int64_t last = ctas - (ctas - 1) / wave * wave;  // CTAs of the last wave
    const double time = double(ctas - last) / std::min(1.0, double(wave) / want) +
                        double(last) / std::min(1.0, double(last) / want);
    if (r == resident || time < best_time * 0.99) best_r = r, best_time = time;
  }
  if (best_r == resident) return {kDecodeWarps, own};
  return {kDecodeWarps, std::min(max_smem_per_block(device), smem_per_sm(device) / best_r - 1024)};
}

}  // namespace flashattn2
