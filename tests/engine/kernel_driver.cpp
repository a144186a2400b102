// Runs CPU-kernel calls read from a file against a kernel library (dlopen), for tests/engine/cross.py: there the
// kernels are built for AArch64 with a cross compiler and this driver runs under qemu-user, so an x86 machine
// checks the NEON build's bits against its own builds.
//
//   kernel_driver LIBRARY CALLS OUT
//
// CALLS: call after call, each: the function's name (int64 length, bytes), the argument count (int64), then per
// argument a kind byte and its value: 'n' an int64 (a long or int parameter), 'd' a double (a float parameter),
// 'b' a buffer (int64 byte count, bytes), 's' a struct (int64 byte count, bytes, int64 link count, then per link
// the int64 byte offset of a pointer field and the int64 index of the buffer argument it points to). OUT: after
// each call, every buffer argument's bytes, in order. Exit 4: layer_front or decoder_layers returned an error.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

struct Arg {
  char kind;
  int64_t n;
  double d;
  std::vector<unsigned char> bytes;
  std::vector<int64_t> links;  // a struct's (offset, buffer index) pairs
};

static bool read_all(FILE* f, void* p, size_t n) { return n == 0 || fread(p, 1, n, f) == n; }

// false at the end of the calls (or on a truncated one: then not at EOF, see main)
static bool read_call(FILE* f, std::string& name, std::vector<Arg>& args) {
  int64_t length, count;
  if (fread(&length, 1, 8, f) != 8) return false;
  name.resize(length);
  if (!read_all(f, &name[0], length) || !read_all(f, &count, 8)) return false;
  args.assign(count, Arg());
  for (Arg& a : args) {
    if (!read_all(f, &a.kind, 1)) return false;
    if (a.kind == 'n' && !read_all(f, &a.n, 8)) return false;
    if (a.kind == 'd' && !read_all(f, &a.d, 8)) return false;
    if (a.kind == 'b' || a.kind == 's') {
      int64_t size;
      if (!read_all(f, &size, 8)) return false;
      a.bytes.resize(size + 64);  // slack: a zero-length buffer still has an address
      if (!read_all(f, a.bytes.data(), size)) return false;
      a.bytes.resize(size);
    }
    if (a.kind == 's') {
      int64_t count;
      if (!read_all(f, &count, 8)) return false;
      a.links.resize(2 * count);
      if (!read_all(f, a.links.data(), 16 * count)) return false;
    }
  }
  for (Arg& a : args)  // the structs' pointers, to their buffers (which do not move from here on)
    for (size_t i = 0; i < a.links.size(); i += 2) {
      if (a.links[i] + 8 > (int64_t)a.bytes.size() || a.links[i + 1] >= (int64_t)args.size()) return false;
      void* target = args[a.links[i + 1]].bytes.data();
      memcpy(a.bytes.data() + a.links[i], &target, 8);
    }
  return true;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: kernel_driver LIBRARY CALLS OUT\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  FILE *in = fopen(argv[2], "rb"), *out = fopen(argv[3], "wb");
  if (lib == nullptr || in == nullptr || out == nullptr) {
    fprintf(stderr, "kernel_driver: %s\n", lib == nullptr ? dlerror() : "cannot open the call files");
    return 2;
  }
  std::string name;
  std::vector<Arg> args;
  while (read_call(in, name, args)) {
    void* fn = dlsym(lib, name.c_str());
    if (fn == nullptr) {
      fprintf(stderr, "kernel_driver: no function %s\n", name.c_str());
      return 2;
    }
    auto P = [&](int i) { return (void*)args[i].bytes.data(); };
    auto L = [&](int i) { return (long)args[i].n; };
    auto I = [&](int i) { return (int)args[i].n; };
    auto F = [&](int i) { return (float)args[i].d; };
    typedef void* p;
    if (name == "panel_gemm")
      ((void (*)(p, long, long, p, p, long, int))fn)(P(0), L(1), L(2), P(3), P(4), L(5), I(6));
    else if (name == "panel4_gemm")
      ((void (*)(p, long, long, p, p, p, p, long, int))fn)(P(0), L(1), L(2), P(3), P(4), P(5), P(6), L(7), I(8));
    else if (name == "panel8_gemm")
      ((void (*)(p, long, long, p, p, p, long, int))fn)(P(0), L(1), L(2), P(3), P(4), P(5), L(6), I(7));
    else if (name == "rms_norm")
      ((void (*)(p, long, long, p, float, p))fn)(P(0), L(1), L(2), P(3), F(4), P(5));
    else if (name == "causal_attention" || name == "causal_attention_half")
      ((void (*)(p, long, long, long, p, p, long, long, long, long, float, p, int))fn)(
          P(0), L(1), L(2), L(3), P(4), P(5), L(6), L(7), L(8), L(9), F(10), P(11), I(12));
    else if (name == "layer_front") {
      typedef int (*front)(p, long, p, p, int, long, long, long, long, p, p, long, long, long, long, float, p, int);
      if (((front)fn)(P(0), L(1), P(2), P(3), I(4), L(5), L(6), L(7), L(8), P(9), P(10), L(11), L(12), L(13), L(14),
                      F(15), P(16), I(17)) != 0)
        return 4;
    } else if (name == "decoder_layers") {
      typedef int (*layers)(p, long, long, p, p, p, long, long, long, long, p, p, long, long, long, long, float, int);
      if (((layers)fn)(P(0), L(1), L(2), P(3), P(4), P(5), L(6), L(7), L(8), L(9), P(10), P(11), L(12), L(13), L(14),
                       L(15), F(16), I(17)) != 0)
        return 4;
    } else if (name == "silu_mul")
      ((void (*)(p, long, long, p))fn)(P(0), L(1), L(2), P(3));
    else if (name == "rotary_rows")
      ((void (*)(p, long, long, long, long, p, p, p, long))fn)(P(0), L(1), L(2), L(3), L(4), P(5), P(6), P(7), L(8));
    else {
      fprintf(stderr, "kernel_driver: no signature for %s\n", name.c_str());
      return 2;
    }
    for (const Arg& a : args)
      if (a.kind == 'b' && fwrite(a.bytes.data(), 1, a.bytes.size(), out) != a.bytes.size()) return 3;
  }
  fclose(out);
  const long end = ftell(in);
  fseek(in, 0, SEEK_END);
  return end == ftell(in) ? 0 : 3;  // every byte read: no truncated call
}
