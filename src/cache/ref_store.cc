// A placeholder store that keeps nothing (every lookup misses): the interface's first cut, so
// that the library and its callers build while the real store is written.
#include "cache/ref_store.h"

#include "flowkv/error.h"

namespace flowkv::store {

struct KeyBuilder::State {
  std::string bytes;
};

KeyBuilder::KeyBuilder(std::string kind) : s_(std::make_unique<State>()), kind_(std::move(kind)) {}
KeyBuilder::~KeyBuilder() = default;
KeyBuilder& KeyBuilder::bytes(std::string_view, const void*, size_t) {
  return *this;
}
KeyBuilder& KeyBuilder::text(std::string_view, std::string_view) {
  return *this;
}
KeyBuilder& KeyBuilder::integer(std::string_view, int64_t) {
  return *this;
}
KeyBuilder& KeyBuilder::real(std::string_view, double) {
  return *this;
}
KeyBuilder& KeyBuilder::tensor(std::string_view, const Tensor&) {
  return *this;
}
Key KeyBuilder::finish() {
  return Key{kind_, {}};
}

std::string Key::hex() const {
  return std::string(64, '0');
}

int64_t Entry::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.nbytes();
  return n;
}

struct Store::State {
  StoreOptions options;
};

Store::Store(const StoreOptions& o) : s_(std::make_unique<State>()) {
  s_->options = o;
}
Store::~Store() = default;
Handle Store::find(const Key&) {
  return nullptr;
}
Handle Store::insert(const Key&, Entry entry) {
  return std::make_shared<const Entry>(std::move(entry));
}
StoreStats Store::stats() const {
  return {};
}
void Store::clear() {}
const StoreOptions& Store::options() const {
  return s_->options;
}

std::string serialize(const Key&, const Entry&) {
  fail("store: no disk tier yet");
}
Entry deserialize(const Key&, std::string_view, const std::string& what) {
  fail(what, ": no disk tier yet");
}

}  // namespace flowkv::store

namespace flowkv {

struct ReferenceStore::Impl {
  explicit Impl(const StoreOptions& o) : store(o) {}
  store::Store store;
};

ReferenceStore::ReferenceStore(const StoreOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
ReferenceStore::~ReferenceStore() = default;
const StoreOptions& ReferenceStore::options() const {
  return impl_->store.options();
}
StoreStats ReferenceStore::stats() const {
  return impl_->store.stats();
}
void ReferenceStore::clear() {
  impl_->store.clear();
}

store::Store& store::of(const ReferenceStore& r) {
  return r.impl().store;
}

}  // namespace flowkv
