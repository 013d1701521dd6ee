// Appended after the kernel source: reads buffers and launches, runs every thread, writes back.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
static const bool riffle_asan = true;
#else
static const bool riffle_asan = false;
#endif

// Named when a sanitizer stops the run: which launch and thread it was in.
static const char* riffle_running = "no kernel";

static void riffle_on_death() {
    fprintf(stderr, "kernel emulation: stopped in %s, block (%u, %u, %u) thread (%u, %u, %u)\n",
            riffle_running, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
            threadIdx.z);
}

namespace riffle {

[[noreturn]] void fail(const std::string& message) {
    fprintf(stderr, "kernel emulation: %s\n", message.c_str());
    exit(3);
}

template <typename T> struct Tag { static const int value = -1; };
template <> struct Tag<float> { static const int value = 0; };
template <> struct Tag<int> { static const int value = 1; };
template <> struct Tag<long long> { static const int value = 2; };
template <> struct Tag<unsigned char> { static const int value = 3; };
template <> struct Tag<unsigned int> { static const int value = 4; };

std::string tag_name(int tag) {
    switch (tag) {
        case 0: return "float (f32)";
        case 1: return "int (i32)";
        case 2: return "long long (i64)";
        case 3: return "unsigned char (u8)";
        case 4: return "unsigned int (u32)";
    }
    return "an unknown type";
}

size_t tag_size(int tag) {
    switch (tag) {
        case 0: case 1: case 4: return 4;
        case 2: return 8;
        case 3: return 1;
    }
    fail("unknown element type " + std::to_string(tag));
}

const size_t GUARD = 4096;
const unsigned char CANARY = 0xA5;

struct Buffer {
    int tag;
    size_t n;
    size_t bytes;
    unsigned char* base;
    unsigned char* data;
};

// Under AddressSanitizer each buffer is its own allocation of exactly its size, so any access
// outside it is reported; otherwise guard bytes around it catch writes.
Buffer alloc(int tag, size_t n) {
    Buffer b{tag, n, n * tag_size(tag), nullptr, nullptr};
    if (riffle_asan) {
        b.base = static_cast<unsigned char*>(malloc(b.bytes));
        b.data = b.base;
    } else {
        b.base = static_cast<unsigned char*>(malloc(b.bytes + 2 * GUARD));
        b.data = b.base + GUARD;
        memset(b.base, CANARY, GUARD);
        memset(b.data + b.bytes, CANARY, GUARD);
    }
    if (!b.base && b.bytes) fail("out of memory");
    return b;
}

void check_guards(const std::vector<Buffer>& bufs, const std::string& kernel) {
    if (riffle_asan) return;
    for (size_t i = 0; i < bufs.size(); ++i) {
        const Buffer& b = bufs[i];
        for (size_t k = 0; k < GUARD; ++k) {
            if (b.base[k] != CANARY || b.data[b.bytes + k] != CANARY) {
                fail(kernel + " wrote outside buffer " + std::to_string(i) + " (" +
                     std::to_string(b.n) + " elements)");
            }
        }
    }
}

struct Arg {
    int kind;  // 0: a buffer, 1: a scalar
    int tag;
    size_t buf;
    unsigned long long raw;
};

struct Launch {
    std::string kernel;
    unsigned grid[3], block[3], shared;
    std::vector<Arg> args;
};

struct Reader {
    const std::vector<unsigned char>& bytes;
    size_t at;
    void take(void* out, size_t n) {
        if (at + n > bytes.size()) fail("truncated input");
        memcpy(out, bytes.data() + at, n);
        at += n;
    }
    unsigned u8() { unsigned char v; take(&v, 1); return v; }
    unsigned u32() { unsigned v; take(&v, 4); return v; }
    unsigned long long u64() { unsigned long long v; take(&v, 8); return v; }
};

template <typename P>
P take_arg(const Launch& l, size_t i, std::vector<Buffer>& bufs) {
    const Arg& a = l.args[i];
    std::string where = l.kernel + ": parameter " + std::to_string(i);
    using T = typename std::remove_cv<P>::type;
    if constexpr (std::is_pointer<T>::value) {
        using E = typename std::remove_cv<typename std::remove_pointer<T>::type>::type;
        static_assert(Tag<E>::value >= 0, "a kernel parameter points to an unknown type");
        if (a.kind != 0) {
            fail(where + " is a pointer to " + tag_name(Tag<E>::value) + ", but a scalar " +
                 tag_name(a.tag) + " was pushed");
        }
        if (a.buf >= bufs.size()) fail(where + ": no buffer " + std::to_string(a.buf));
        const Buffer& b = bufs[a.buf];
        if (b.tag != Tag<E>::value) {
            fail(where + " points to " + tag_name(Tag<E>::value) + ", but the buffer holds " +
                 tag_name(b.tag));
        }
        return reinterpret_cast<P>(b.data);
    } else {
        static_assert(Tag<T>::value >= 0, "a kernel parameter has an unknown type");
        if (a.kind != 1) {
            fail(where + " is " + tag_name(Tag<T>::value) + ", but a buffer was pushed");
        }
        if (a.tag != Tag<T>::value) {
            fail(where + " is " + tag_name(Tag<T>::value) + " (" + std::to_string(sizeof(T)) +
                 " bytes), but " + tag_name(a.tag) + " (" + std::to_string(tag_size(a.tag)) +
                 " bytes) was pushed");
        }
        T v;
        memcpy(&v, &a.raw, sizeof(T));
        return v;
    }
}

template <typename... P, size_t... I>
std::tuple<P...> take_args(const Launch& l, std::vector<Buffer>& bufs, std::index_sequence<I...>) {
    return std::tuple<P...>(take_arg<P>(l, I, bufs)...);
}

void check_config(const Launch& l) {
    const unsigned* g = l.grid;
    const unsigned* b = l.block;
    std::string dims = " (grid " + std::to_string(g[0]) + "x" + std::to_string(g[1]) + "x" +
                       std::to_string(g[2]) + ", block " + std::to_string(b[0]) + "x" +
                       std::to_string(b[1]) + "x" + std::to_string(b[2]) + ")";
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2]) {
        fail(l.kernel + ": an empty launch is an error on a GPU" + dims);
    }
    if (g[0] > 2147483647u || g[1] > 65535u || g[2] > 65535u) {
        fail(l.kernel + ": the grid exceeds CUDA's limits" + dims);
    }
    if (b[0] > 1024u || b[1] > 1024u || b[2] > 64u ||
        (unsigned long long)b[0] * b[1] * b[2] > 1024ull) {
        fail(l.kernel + ": the block exceeds CUDA's limits" + dims);
    }
    if (l.shared) fail(l.kernel + ": dynamic shared memory is not emulated");
}

template <typename... P>
void run(void (*kernel)(P...), const Launch& l, std::vector<Buffer>& bufs, bool backwards) {
    if (l.args.size() != sizeof...(P)) {
        fail(l.kernel + " takes " + std::to_string(sizeof...(P)) + " parameters, but " +
             std::to_string(l.args.size()) + " were pushed");
    }
    check_config(l);
    std::tuple<P...> args = take_args<P...>(l, bufs, std::index_sequence_for<P...>{});
    riffle_running = l.kernel.c_str();
    gridDim = {l.grid[0], l.grid[1], l.grid[2]};
    blockDim = {l.block[0], l.block[1], l.block[2]};
    unsigned long long blocks = (unsigned long long)l.grid[0] * l.grid[1] * l.grid[2];
    unsigned long long threads = (unsigned long long)l.block[0] * l.block[1] * l.block[2];
    for (unsigned long long bi = 0; bi < blocks; ++bi) {
        unsigned long long b = backwards ? blocks - 1 - bi : bi;
        unsigned bx = b % l.grid[0], by = b / l.grid[0] % l.grid[1];
        unsigned bz = b / l.grid[0] / l.grid[1];
        for (unsigned long long ti = 0; ti < threads; ++ti) {
            unsigned long long t = backwards ? threads - 1 - ti : ti;
            unsigned tx = t % l.block[0], ty = t / l.block[0] % l.block[1];
            unsigned tz = t / l.block[0] / l.block[1];
            riffle_set_index(bx, by, bz, tx, ty, tz);
            std::apply(kernel, args);
        }
    }
}

}  // namespace riffle

void riffle_dispatch(const riffle::Launch& l, std::vector<riffle::Buffer>& bufs, bool backwards);

int main(int argc, char** argv) {
    using namespace riffle;
    if (argc != 3) fail("usage: emulator INPUT OUTPUT");
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_set_death_callback(riffle_on_death);
#endif
    std::vector<unsigned char> bytes;
    {
        FILE* f = fopen(argv[1], "rb");
        if (!f) fail(std::string("cannot open ") + argv[1]);
        unsigned char chunk[65536];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
        fclose(f);
    }
    Reader r{bytes, 0};
    if (r.u32() != 0x31454b52u) fail("bad input");
    unsigned nbuf = r.u32();
    std::vector<Buffer> forwards, backwards;
    for (unsigned i = 0; i < nbuf; ++i) {
        int tag = (int)r.u8();
        size_t n = (size_t)r.u64();
        Buffer a = alloc(tag, n), b = alloc(tag, n);
        r.take(a.data, a.bytes);
        memcpy(b.data, a.data, a.bytes);
        forwards.push_back(a);
        backwards.push_back(b);
    }
    unsigned nlaunch = r.u32();
    std::vector<Launch> launches(nlaunch);
    for (Launch& l : launches) {
        unsigned len = r.u32();
        l.kernel.resize(len);
        r.take(&l.kernel[0], len);
        for (unsigned& v : l.grid) v = r.u32();
        for (unsigned& v : l.block) v = r.u32();
        l.shared = r.u32();
        unsigned nargs = r.u32();
        for (unsigned k = 0; k < nargs; ++k) {
            Arg a{(int)r.u8(), 0, 0, 0};
            if (a.kind == 0) a.buf = r.u32(); else { a.tag = (int)r.u8(); a.raw = r.u64(); }
            l.args.push_back(a);
        }
    }
    bool check_order = r.u8() != 0;
    for (const Launch& l : launches) {
        riffle_dispatch(l, forwards, false);
        check_guards(forwards, l.kernel);
    }
    if (check_order) {
        for (const Launch& l : launches) {
            riffle_dispatch(l, backwards, true);
            check_guards(backwards, l.kernel);
        }
        for (unsigned i = 0; i < nbuf; ++i) {
            const Buffer& a = forwards[i];
            const Buffer& b = backwards[i];
            if (memcmp(a.data, b.data, a.bytes) != 0) {
                size_t at = 0;
                while (a.data[at] == b.data[at]) ++at;
                fail("buffer " + std::to_string(i) + " differs at element " +
                     std::to_string(at / tag_size(a.tag)) +
                     " between threads run forwards and backwards: threads depend on each "
                     "other's order (a race on a GPU)");
            }
        }
    }
    FILE* out = fopen(argv[2], "wb");
    if (!out) fail(std::string("cannot write ") + argv[2]);
    for (const Buffer& b : forwards) {
        if (fwrite(b.data, 1, b.bytes, out) != b.bytes) fail("short write");
    }
    if (fclose(out) != 0) fail("short write");
    for (unsigned i = 0; i < nbuf; ++i) {
        free(forwards[i].base);
        free(backwards[i].base);
    }
    return 0;
}
