#include "cache/snapshot.h"

#include <cmath>
#include <cstring>

#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

const StreamCopy* entry(const Snapshot& v, const std::string& name) {
  for (const StreamCopy& c : v) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const StreamCopy& entry_for(const Snapshot& v, const Stream& s) {
  const StreamCopy* c = entry(v, s.name);
  FLOWKV_CHECK(c, "no stored values for the stream '", s.name, "'");
  return *c;
}

}  // namespace

void copy_into(StreamCopy& c, const Stream& s, int64_t batch) {
  c.batch = batch, c.seq = s.seq, c.cols = s.x.cols, c.name = s.name;
  c.v.resize(static_cast<size_t>(batch * s.seq * s.x.cols));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < s.seq; ++t) {
      std::memcpy(&c.v[static_cast<size_t>((b * s.seq + t) * c.cols)], s.x.row(s.row(b) + t),
                  static_cast<size_t>(c.cols) * 4);
    }
  }
}

StreamCopy copy_stream(const Stream& s, int64_t batch) {
  StreamCopy c;
  copy_into(c, s, batch);
  return c;
}

void residual_into(StreamCopy& out, const Stream& s, int64_t batch, const StreamCopy& base) {
  FLOWKV_CHECK(base.batch == batch && base.seq == s.seq && base.cols == s.x.cols, "the stream '",
               s.name, "' changed shape between calls");
  out.batch = batch, out.seq = s.seq, out.cols = s.x.cols, out.name = s.name;
  out.v.resize(base.v.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < s.seq; ++t) {
      const size_t off = static_cast<size_t>((b * s.seq + t) * out.cols);
      const float* row = s.x.row(s.row(b) + t);
      for (int64_t c = 0; c < out.cols; ++c) out.v[off + c] = row[c] - base.v[off + c];
    }
  }
}

StreamCopy copy_mat(Mat m) {
  StreamCopy c{1, m.rows, m.cols, std::vector<float>(static_cast<size_t>(m.rows * m.cols)), ""};
  for (int64_t r = 0; r < m.rows; ++r)
    std::memcpy(&c.v[static_cast<size_t>(r * m.cols)], m.row(r), static_cast<size_t>(m.cols) * 4);
  return c;
}

Snapshot snapshot(const Streams& s) {
  Snapshot out;
  for (const Stream& st : s.s) out.push_back(copy_stream(st, s.batch));
  return out;
}

StreamCopy minus(const StreamCopy& a, const StreamCopy& b) {
  FLOWKV_CHECK(same_shape(a, b), "the stream '", a.name, "' changed shape between calls");
  StreamCopy c = a;
  for (size_t i = 0; i < c.v.size(); ++i) c.v[i] = a.v[i] - b.v[i];
  return c;
}

Snapshot minus(const Snapshot& a, const Snapshot& b) {
  Snapshot out;
  for (const StreamCopy& x : a) {
    const StreamCopy* y = entry(b, x.name);
    FLOWKV_CHECK(y, "the stream '", x.name, "' appeared between calls");
    out.push_back(minus(x, *y));
  }
  return out;
}

void add_into(Stream& s, int64_t batch, const StreamCopy& r) {
  FLOWKV_CHECK(r.seq == s.seq && r.cols == s.x.cols && r.batch == batch,
               "a cached residual does not fit the stream '", s.name, "' (token count changed?)");
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < s.seq; ++t) {
      float* row = s.x.row(s.row(b) + t);
      const float* add = &r.v[static_cast<size_t>((b * s.seq + t) * r.cols)];
      for (int64_t c = 0; c < r.cols; ++c) row[c] += add[c];
    }
  }
}

void add_into(Streams& s, const Snapshot& r) {
  for (Stream& st : s.s) add_into(st, s.batch, entry_for(r, st));
}

void assign(Streams& s, const Snapshot& v) {
  FLOWKV_CHECK(fits(v, s), "stored values do not fit the streams (token count changed?)");
  for (Stream& st : s.s) {
    const StreamCopy& c = entry_for(v, st);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < st.seq; ++t) {
        std::memcpy(st.x.row(st.row(b) + t), &c.v[static_cast<size_t>((b * st.seq + t) * c.cols)],
                    static_cast<size_t>(c.cols) * 4);
      }
    }
  }
}

bool same_shape(const StreamCopy& a, const StreamCopy& b) {
  return a.batch == b.batch && a.seq == b.seq && a.cols == b.cols;
}

bool fits(const Snapshot& v, const Streams& s) {
  for (const Stream& st : s.s) {
    const StreamCopy* c = entry(v, st.name);
    if (!c || c->batch != s.batch || c->seq != st.seq || c->cols != st.x.cols) return false;
  }
  return true;
}

double relative_l1(const StreamCopy& a, const StreamCopy& ref) {
  if (!same_shape(a, ref)) return INFINITY;  // a changed shape is a large change: compute
  double num = 0, den = 0;
  for (size_t i = 0; i < a.v.size(); ++i) {
    num += std::abs(double(a.v[i]) - ref.v[i]);
    den += std::abs(double(ref.v[i]));
  }
  return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

double mean_norm_ratio(const StreamCopy& a, const StreamCopy& b) {
  FLOWKV_CHECK(a.v.size() == b.v.size(), "stream shapes changed between calls");
  const int64_t tokens = a.batch * a.seq;
  double sum = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    double na = 0, nb = 0;
    for (int64_t c = 0; c < a.cols; ++c) {
      const double x = a.v[static_cast<size_t>(t * a.cols + c)],
                   y = b.v[static_cast<size_t>(t * a.cols + c)];
      na += x * x;
      nb += y * y;
    }
    sum += std::sqrt(na) / (std::sqrt(nb) + 1e-8);
  }
  return tokens > 0 ? sum / static_cast<double>(tokens) : 1.0;
}

}  // namespace flowkv::cache
