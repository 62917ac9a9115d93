#include "pipeline/request_store.h"

#include <algorithm>

#include "pipeline/identity.h"

namespace flowkv::pipeline {

RequestStore::RequestStore(std::shared_ptr<ReferenceStore> store) : shared_(std::move(store)) {
  if (shared_) store_ = &store::of(*shared_);
}

std::vector<Tensor> RequestStore::get(const store::Key& key,
                                      const std::function<std::vector<Tensor>()>& compute,
                                      bool* hit) {
  if (hit) *hit = false;
  if (!store_) return compute();
  keys_.push_back(key.hex());
  if (store::Handle h = store_->find(key)) {
    ++hits_;
    if (hit) *hit = true;
    std::vector<Tensor> out = h->tensors;
    held_.push_back(std::move(h));
    return out;
  }
  ++misses_;
  store::Handle h = store_->insert(key, store::Entry{compute()});
  std::vector<Tensor> out = h->tensors;
  held_.push_back(std::move(h));
  return out;
}

Tensor RequestStore::image_latents(const std::string& vae, const std::string& rule,
                                   const Image& image, const std::function<Tensor()>& encode,
                                   bool* hit) {
  *hit = false;
  if (!store_) return encode();
  store::KeyBuilder key("latents");
  add_files_identity(key, "vae", vae);
  key.text("rule", rule);
  key.integer("width", image.width).integer("height", image.height);
  key.integer("channels", image.channels);
  key.bytes("pixels", image.pixels.data(), image.pixels.size());
  return get(
             key.finish(), [&] { return std::vector<Tensor>{encode()}; }, hit)
      .at(0);
}

void RequestStore::add(const DenoiseResult& r) {
  keys_.insert(keys_.end(), r.store_keys.begin(), r.store_keys.end());
  hits_ += r.store_hits;
  misses_ += r.store_misses;
}

void RequestStore::report(GenerateResult& r) const {
  r.store_keys = keys_;
  r.store_hits = hits_;
  r.store_misses = misses_;
}

std::vector<int> preview_steps(int previews, int steps) {
  std::vector<int> out;
  if (previews <= 0 || steps <= 1) return out;
  for (int i = 1; i <= previews; ++i) {
    const int s = std::clamp(static_cast<int>(static_cast<int64_t>(steps) * i / (previews + 1)), 1,
                             steps - 1);
    if (out.empty() || s > out.back()) out.push_back(s);
  }
  return out;
}

}  // namespace flowkv::pipeline
