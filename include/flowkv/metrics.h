// Image quality metrics between two pictures of the same size and channel count (8-bit RGB or
// RGBA, flowkv/image.h): a result against its ground truth, or an approximate run against the
// exact one. Both match scikit-image 0.25.2 (tests/golden/metrics, python/ref/dump_metrics.py).
#pragma once

#include "flowkv/image.h"

namespace flowkv {

// Peak signal-to-noise ratio in dB over every value of every channel (alpha included), peak
// 255: 10 log10(255^2 / MSE), as skimage.metrics.peak_signal_noise_ratio(a, b,
// data_range=255). Identical pictures give +infinity. Pictures of different sizes or channel
// counts, or empty ones, are a flowkv::Error.
double psnr(const Image& a, const Image& b);

// Mean structural similarity (Wang et al. 2004) in [-1, 1], 1 for identical pictures: each
// channel's SSIM map from Gaussian-weighted local statistics (sigma 1.5, 11 taps, edges
// mirrored half-sample as scipy's mode "reflect", population covariance, K1 0.01, K2 0.03,
// data range 255), averaged over the interior (5 pixels from each edge left out), then over
// the channels: skimage.metrics.structural_similarity(a, b, channel_axis=2, data_range=255,
// gaussian_weights=True, sigma=1.5, use_sample_covariance=False). Pictures smaller than 11
// pixels on a side, or of different sizes or channel counts, are a flowkv::Error.
double ssim(const Image& a, const Image& b);

}  // namespace flowkv
