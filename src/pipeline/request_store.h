// One request's use of the reference store (include/flowkv/store.h) for its stages' products:
// prompt embeddings and conditioning latents looked up before the work and kept after it, the
// denoising loop's K/V entries counted, and the keys reported with the result. The handles it
// holds pin the entries until the request ends.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/ref_store.h"
#include "flowkv/generate.h"
#include "flowkv/model.h"
#include "io/image.h"

namespace flowkv::pipeline {

class RequestStore {
 public:
  explicit RequestStore(std::shared_ptr<ReferenceStore> store);
  bool active() const { return store_ != nullptr; }
  const std::shared_ptr<ReferenceStore>& shared() const { return shared_; }

  // The tensors under `key`: the stored ones on a hit (*hit true), else compute()'s, which are
  // then kept. Without a store, compute()'s.
  std::vector<Tensor> get(const store::Key& key,
                          const std::function<std::vector<Tensor>()>& compute, bool* hit = nullptr);
  // A preprocessed image's VAE latents: under a key of the VAE's identity (`vae`: its folder),
  // the preprocessing `rule` and the pixels, else encode()'s.
  Tensor image_latents(const std::string& vae, const std::string& rule, const Image& image,
                       const std::function<Tensor()>& encode, bool* hit);
  // The denoising loop's "kv" lookups.
  void add(const DenoiseResult& r);
  // Keys, hits and misses into the result.
  void report(GenerateResult& r) const;

 private:
  std::shared_ptr<ReferenceStore> shared_;
  store::Store* store_ = nullptr;
  std::vector<store::Handle> held_;
  std::vector<std::string> keys_;
  int64_t hits_ = 0, misses_ = 0;
};

// The steps (1-based) after which a request's `previews` previews of `steps` steps are drawn:
// evenly spaced, before the last step (whose picture is the result), at most one per step.
std::vector<int> preview_steps(int previews, int steps);

}  // namespace flowkv::pipeline
