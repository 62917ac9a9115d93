// 2-D discrete Fourier transforms over a latent grid, for FasterCache's frequency split of the
// CFG difference and SeaCache's spectral filter. Plain separable DFTs in double (grids are at
// most a few thousand tokens; this runs once per step, next to a transformer call).
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

// SeaCache's SEA filter (diffusers 0.42.1 hooks/sea_cache.py, _apply_sea_filter) of one frame
// x[h * w, channels] (channels last) at noise level sigma: per axis (frame, rows, columns) of
// length n the Wiener gain g(f) = a S / (a^2 S + b^2 + 1e-16), S = 1 / (|f|^p + 1e-16), f the
// DFT frequencies (numpy's fftfreq(n)), a = 1 - sigma, b = sigma with sigma clamped to
// [1e-6, 1 - 1e-6], p = power; the product of the axes' gains divided by its mean multiplies
// the spectrum; out is the real part of the inverse DFT. The gains are float32, as diffusers
// computes them.
std::vector<float> sea_axis_gain(int64_t n, double sigma, double power);
void sea_axis_gain(int64_t n, double sigma, double power, std::vector<float>& g);  // into g
// Reference: the gain grid applied to a full 2-D DFT of each channel.
void sea_filter_reference(const float* x, int64_t h, int64_t w, int64_t channels, double sigma,
                          double power, float* out);
// The same as two real circulant convolutions, along columns then rows: each axis' gain is
// real and even (|f| is), so its inverse DFT is a real symmetric kernel, and the gain grid is
// the product of the axes' gains (up to float32 rounding of that product). O(h w (h + w) C).
void sea_filter(const float* x, int64_t h, int64_t w, int64_t channels, double sigma, double power,
                float* out);
// The buffers sea_filter works in, kept by its caller from call to call (sized on the first
// call of a shape, no allocation after): one per policy, which filters every step.
struct SeaScratch {
  std::vector<float> gh, gw, gt;
  std::vector<double> kernel, mh, mw, t, acc;
};
void sea_filter(const float* x, int64_t h, int64_t w, int64_t channels, double sigma, double power,
                float* out, SeaScratch& scratch);

}  // namespace flowkv::cache
