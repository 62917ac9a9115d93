// The server's request parsing (tools/server/request.h) against hostile values: sizes, numbers,
// field types, unknown fields, multipart fields. Every refusal is an ApiError 400 naming the field.
#include "request.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>

#include "flowkv/error.h"
#include "server.h"

namespace flowkv::server {
namespace {

using nlohmann::json;

std::string param_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.param;
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(ServerRequest, SizeParses) {
  EXPECT_EQ(parse_size("auto", 1 << 20), std::make_pair(int64_t{0}, int64_t{0}));
  EXPECT_EQ(parse_size("1024x768", 1 << 20), std::make_pair(int64_t{1024}, int64_t{768}));
  EXPECT_EQ(parse_size("1x1", 1), std::make_pair(int64_t{1}, int64_t{1}));
}

TEST(ServerRequest, SizeRefusesHostile) {
  for (const char* s : {"",
                        "x",
                        "1024",
                        "1024x",
                        "x1024",
                        "0x64",
                        "64x0",
                        "-64x64",
                        "64x-64",
                        "+64x64",
                        " 64x64",
                        "64x64 ",
                        "64X64",
                        "64x64x64",
                        "65537x1",
                        "18446744073709551616x1",
                        "99999999999999999999999x1",
                        "4294967297x1",
                        "64x6.4",
                        "0x0",
                        "1e3x1",
                        "AUTO",
                        "64\0x64",
                        "\xff\xfe"}) {
    EXPECT_EQ(param_of([&] { parse_size(s, int64_t{1} << 40); }), "size") << s;
  }
  // Within each side's limit, over the pixel limit; and the product that would overflow 32 bits.
  EXPECT_EQ(param_of([] { parse_size("1025x1024", 1 << 20); }), "size");
  EXPECT_EQ(param_of([] { parse_size("65536x65536", 1 << 26); }), "size");
}

TEST(ServerRequest, StrictIntegers) {
  uint64_t u = 0;
  int64_t i = 0;
  EXPECT_TRUE(parse_u64("18446744073709551615", u));
  EXPECT_EQ(u, std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(parse_u64("18446744073709551616", u));
  EXPECT_FALSE(parse_u64("-1", u));
  EXPECT_FALSE(parse_u64("+1", u));
  EXPECT_FALSE(parse_u64("1 ", u));
  EXPECT_FALSE(parse_u64("", u));
  EXPECT_FALSE(parse_u64("0x10", u));
  EXPECT_TRUE(parse_i64("-5", i));
  EXPECT_EQ(i, -5);
  EXPECT_FALSE(parse_i64("9223372036854775808", i));
  EXPECT_FALSE(parse_i64("1.5", i));
}

TEST(ServerRequest, JsonFields) {
  const RequestLimits lim;
  const ImageRequest r = parse_request(
      json::parse(R"({"prompt":"a fox","n":2,"size":"64x32","steps":3,"seed":18446744073709551615,
        "negative_prompt":"","cfg_scale":4,"resolution":64,"kv_cache":false,
        "step_caches":["taylorseer:interval=2"],"stream":true,"partial_images":2,
        "response_format":"b64_json","output_format":"png","quality":"auto","user":"u",
        "model":null})"),
      false, lim);
  EXPECT_EQ(r.generate.prompt, "a fox");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.generate.width, 64);
  EXPECT_EQ(r.generate.height, 32);
  EXPECT_EQ(r.generate.steps, 3);
  EXPECT_EQ(r.generate.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(r.generate.has_negative_prompt);
  EXPECT_EQ(r.generate.cfg_scale, 4.0f);
  EXPECT_FALSE(r.generate.kv_cache);
  EXPECT_EQ(r.generate.step_caches.size(), 1u);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.partial_images, 2);
  EXPECT_EQ(r.user, "u");
}

TEST(ServerRequest, JsonRefusesHostile) {
  const RequestLimits lim;
  const std::pair<const char*, const char*> cases[] = {
      {R"([])", ""},
      {R"("prompt")", ""},
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":"a","n":0})", "n"},
      {R"({"prompt":"a","n":5})", "n"},
      {R"({"prompt":"a","n":1.5})", "n"},
      {R"({"prompt":"a","n":"2"})", "n"},
      {R"({"prompt":"a","n":18446744073709551615})", "n"},
      {R"({"prompt":"a","n":-9223372036854775808})", "n"},
      {R"({"prompt":"a","steps":0})", "steps"},
      {R"({"prompt":"a","steps":201})", "steps"},
      {R"({"prompt":"a","seed":-1})", "seed"},
      {R"({"prompt":"a","seed":1e30})", "seed"},
      {R"({"prompt":"a","cfg_scale":-1})", "cfg_scale"},
      {R"({"prompt":"a","cfg_scale":1e300})", "cfg_scale"},
      {R"({"prompt":"a","cfg_scale":"4"})", "cfg_scale"},
      {R"({"prompt":"a","resolution":31})", "resolution"},
      {R"({"prompt":"a","kv_cache":1})", "kv_cache"},
      {R"({"prompt":"a","step_caches":"taylorseer"})", "step_caches"},
      {R"({"prompt":"a","step_caches":[1]})", "step_caches"},
      {R"({"prompt":"a","step_caches":["a","b","c","d","e","f","g","h","i"]})", "step_caches"},
      {R"({"prompt":"a","response_format":"url"})", "response_format"},
      {R"({"prompt":"a","output_format":"webp"})", "output_format"},
      {R"({"prompt":"a","output_compression":50})", "output_compression"},
      {R"({"prompt":"a","quality":"hd"})", "quality"},
      {R"({"prompt":"a","background":"transparent"})", "background"},
      {R"({"prompt":"a","partial_images":4})", "partial_images"},
      {R"({"prompt":"a","partial_images":2})", "partial_images"},  // without stream
      {R"({"prompt":"a","stream":"yes"})", "stream"},
      {R"({"prompt":"a","dtype":"f64"})", "dtype"},
      {R"({"prompt":"a","size":512})", "size"},
      {R"({"prompt":"a","size":"4097x4097"})", "size"},
      {R"({"prompt":"a","steps_":1})", "steps_"},
      {R"({"prompt":"a","mask":"x"})", "mask"},  // a generation has no mask: unknown
  };
  for (const auto& c : cases) {  // no structured binding: clang 14 cannot capture one
    EXPECT_EQ(param_of([&] { parse_request(json::parse(c.first), false, lim); }), c.second)
        << c.first;
  }
  EXPECT_EQ(
      param_of([&] { parse_request(json::parse(R"({"prompt":"a","mask":"x"})"), true, lim); }),
      "mask");
  RequestLimits small;
  small.max_prompt_bytes = 4;
  EXPECT_EQ(param_of([&] { parse_request(json::parse(R"({"prompt":"abcde"})"), false, small); }),
            "prompt");
}

TEST(ServerRequest, FormFields) {
  const std::multimap<std::string, std::string> f = {
      {"prompt", "a fox"},    {"n", "2"},           {"seed", "18446744073709551615"},
      {"stream", "true"},     {"cfg_scale", "2.5"}, {"step_caches[]", "a"},
      {"step_caches[]", "b"}, {"size", "64x64"},    {"partial_images", "1"}};
  const ImageRequest r = parse_request(form_fields_to_json(f), true, RequestLimits{});
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.generate.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.generate.cfg_scale, 2.5f);
  EXPECT_EQ(r.generate.step_caches, (std::vector<std::string>{"a", "b"}));
}

TEST(ServerRequest, FormFieldsRefuseHostile) {
  const std::pair<std::multimap<std::string, std::string>, const char*> cases[] = {
      {{{"n", "two"}}, "n"},
      {{{"n", ""}}, "n"},
      {{{"n", "1 "}}, "n"},
      {{{"seed", "-1"}}, "seed"},
      {{{"seed", "99999999999999999999"}}, "seed"},
      {{{"stream", "1"}}, "stream"},
      {{{"cfg_scale", "nan("}}, "cfg_scale"},
      {{{"cfg_scale", ""}}, "cfg_scale"},
      {{{"prompt", "a"}, {"prompt", "b"}}, "prompt"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(param_of([&] { form_fields_to_json(c.first); }), c.second) << c.second;
  }
  // Converted, then refused by the field's range.
  EXPECT_EQ(param_of([] {
              parse_request(form_fields_to_json({{"prompt", "a"}, {"cfg_scale", "inf"}}), true,
                            RequestLimits{});
            }),
            "cfg_scale");
}

// Bodies are parsed with a bound: 60 MB of '[' or a million numbers end in a 400 at the first
// value over the bound, not after building the whole value.
TEST(ServerRequest, BodyParseIsBounded) {
  EXPECT_EQ(parse_body(R"({"prompt": "a fox", "n": 1})")["prompt"], "a fox");
  const auto t0 = std::chrono::steady_clock::now();
  std::string wide = "[";
  for (int i = 0; i < 1000000; ++i) wide += "1,";
  wide += "1]";
  for (const std::string& hostile :
       {std::string(60 << 20, '['), wide,
        std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']')}) {
    try {
      (void)parse_body(hostile);
      ADD_FAILURE() << "accepted a hostile body of " << hostile.size() << " bytes";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_json") << e.what();
    }
  }
  std::string deep_ok;
  for (int i = 0; i < kMaxJsonDepth - 1; ++i) deep_ok += "{\"a\":";
  deep_ok += "1" + std::string(kMaxJsonDepth - 1, '}');
  EXPECT_NO_THROW((void)parse_body(deep_ok));
  EXPECT_THROW((void)parse_body("{\"prompt\": \"\xff\"}"), ApiError);  // not UTF-8
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(ServerRequest, Utf8) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("a fox \xc3\xa9 \xe6\x97\xa5 \xf0\x9f\xa6\x8a"));
  for (const char* bad : {"\xff", "\xc3", "\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80",
                          "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "a\x80", "\xe6\x97"}) {
    EXPECT_FALSE(valid_utf8(bad)) << bad;
  }
  // An error that echoes bytes that are not UTF-8 still renders.
  const std::string body = dump(error_body("size \xff\xfe", "invalid_request_error", "", ""));
  EXPECT_NE(body.find("size \xef\xbf\xbd"), std::string::npos) << body;
}

std::string error_of_keys(const std::vector<std::string>& given, const std::string& file,
                          const char* env) {
  try {
    (void)collect_api_keys(given, file, env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ServerApiKeys, Sources) {
  const std::string dir = ::testing::TempDir();
  const std::string file = dir + "/flowkv-keys-" + std::to_string(::getpid());
  {
    std::ofstream f(file);
    f << "# the team's keys\n\nkey-one-0123456789abcdef\r\n  key-two-0123456789abcdef  \n";
  }
  ::chmod(file.c_str(), 0600);
  const auto keys = collect_api_keys({"key-cli-0123456789abcdef"}, file,
                                     "key-env-0123456789abcdef,key-env2-0123456789abcdef");
  EXPECT_EQ(keys, (std::vector<std::string>{"key-cli-0123456789abcdef", "key-env-0123456789abcdef",
                                            "key-env2-0123456789abcdef", "key-one-0123456789abcdef",
                                            "key-two-0123456789abcdef"}));
  ::chmod(file.c_str(), 0644);
  EXPECT_NE(error_of_keys({}, file, nullptr).find("chmod 600"), std::string::npos);
  EXPECT_NE(error_of_keys({"short"}, "", nullptr).find("16 to 512"), std::string::npos);
  EXPECT_NE(error_of_keys({"has a space in the middle"}, "", nullptr).find("printable"),
            std::string::npos);
  EXPECT_NE(error_of_keys({}, dir, nullptr).find("not a regular file"), std::string::npos);
  EXPECT_NE(error_of_keys({}, "/dev/zero", nullptr).find("not a regular file"), std::string::npos);
  std::remove(file.c_str());
  EXPECT_TRUE(collect_api_keys({}, "", nullptr).empty());
}

}  // namespace
}  // namespace flowkv::server
