// 2-D discrete Fourier transforms over a latent grid, for FasterCache's frequency split of the
// CFG difference. Plain separable DFTs in double (grids are at most a few thousand tokens; this
// runs once per step, next to a transformer call).
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

namespace flowkv::cache {

// A field of `channels` values per grid cell, transformed over (h, w) per channel.
struct Spectrum {
  int64_t h = 0, w = 0, channels = 0;
  std::vector<std::complex<double>> v;  // [channels][h][w]
  bool empty() const { return v.empty(); }
};

// x: [h * w, channels] (row-major grid cells, channels last), as latents are packed.
Spectrum dft2(const float* x, int64_t h, int64_t w, int64_t channels);
// out[h * w, channels] += real(inverse DFT of s).
void add_inverse_dft2(const Spectrum& s, float* out);
// FasterCache's low-frequency set in unshifted frequency indices: after fftshift, the disc of
// radius min(h, w) / 5 around (h / 2, w / 2) (integer division, as diffusers).
std::vector<uint8_t> low_frequency_mask(int64_t h, int64_t w);

}  // namespace flowkv::cache
