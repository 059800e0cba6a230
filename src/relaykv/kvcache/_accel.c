/* Optional C accelerator of relaykv.kvcache (accel.py; docs/routing.md "Cost").
 *
 * A router converts and hashes every prompt it routes (64k tokens: 4,096 hash units), and in
 * pure Python that alone is most of a routing decision. This module does the same work in
 * one call each, with results identical to the pure-Python paths in accel.py and hashing.py
 * (the references, and the fallback when this module was not built):
 *
 *   int32_bytes(tokens, strict=False) -> bytes
 *       Little-endian int32 bytes of a list/tuple of token ids. Items are read with
 *       __index__ (ints, bools, numpy integers; only exact ints when `strict`); an item
 *       that is not an integer raises TypeError and one outside int32 raises OverflowError,
 *       each naming its position.
 *
 *   chain(data, step, parent, first_extra, digest) -> list[bytes]
 *       h_k = digest(h_{k-1} + extra_k + data[k*step:(k+1)*step]) for every full `step`-byte
 *       unit of `data`, h_{-1} = parent, extra_0 = first_extra, later extras empty
 *       (docs/design.md section 2). `digest` is the hash callable (xxhash's
 *       xxh3_128_digest): it is called once per unit on a fresh bytes object, unless it is
 *       the callable `bind_xxh3` checked, whose C function is then called on one reused
 *       buffer. Either way the hash stays xxhash's own: this file implements none of it.
 *
 *   bind_xxh3(path, digest) -> bool
 *       Finds XXH3_128bits in xxhash's own extension module, already loaded from `path`
 *       (dlopen without loading, dlsym), and uses it for `chain` when `digest` is given, if
 *       xxhash is 0.8 or later and the function's canonical digests equal `digest`'s on
 *       inputs of every length 0..300 and of lengths to 8,500 (several of XXH3's 1,024-byte
 *       blocks: a long unit or salt). False (and `chain` keeps calling `digest`) otherwise:
 *       a build of xxhash that does not export the symbol, or a platform without dlopen.
 *
 *   slot_counts(masks) -> (held, runs)
 *       For a buffer of native uint64 bitmasks (one per prompt key, bit s: engine slot s
 *       holds the key), two lists of 64 ints: held[s], the keys whose mask has bit s, and
 *       runs[s], the keys from key 0 on whose masks all have bit s (the run of held keys
 *       from the first). The reference is accel.slot_held_py / slot_run_py, slot by slot.
 *
 *   slot_reused(masks, slot, start, stop, peek) -> bytes
 *       Native int64 indices k in [start, stop), ascending, whose mask in the buffer of
 *       native uint64 bitmasks has bit `slot` and, when `peek`, whose next mask (k + 1, within
 *       the buffer) has it too: kvcache's per-group reuse rule (decode_loads.reused_indices)
 *       on one engine slot's bits. 0 <= start, stop <= len(masks), 0 <= slot < 64. The
 *       reference is decode_loads.reused_in_masks_py.
 *
 *   units_covered(unit, units, groups) -> int
 *       How many of hash units 0..units-1 (of `unit` tokens) start in a reused block of every
 *       group: `groups` is a list of (block_size, indices), indices a buffer of native int64
 *       reused block indices (any order, repeats and indices outside the blocks units start
 *       in ignored). kvcache's count of locally reused prompt tokens (decode_loads
 *       .tokens_local_in); the reference is decode_loads.units_covered_py.
 *
 *   values_u64(mapping, keys) -> bytes
 *       Per key, mapping[key] (a dict of non-negative ints below 2**64) as native uint64, 0
 *       where the key is absent: a router's pass over a prompt's keys in the map of which
 *       engines hold each key (relaykv.router.holders), without a Python call per key.
 *
 *   KeyMasks(seed)
 *       A map of keys to non-zero uint64 bitmasks (a key whose mask becomes 0 is removed):
 *       the router's map of which engines hold each key. A 16-byte bytes key (a block hash)
 *       is stored inline in an open-addressing table (linear probing, at most half full,
 *       backward-shift deletion), placed by a mix of its bytes with the 16-byte `seed` (a
 *       random one per table: where a key lands cannot be chosen from outside); any other
 *       key in a dict beside it (a bytes subclass with bytes' own hash and equality counts
 *       as its bytes, as in a dict). `values(keys)` probes a prompt's keys in batches whose
 *       slots are prefetched together, so their cache misses overlap instead of following
 *       one another as a dict's do (index, entry, key object); it stays exact when an odd
 *       key's __hash__ or __eq__ runs Python code that changes the table. A table of 2 MiB
 *       or more asks for transparent huge pages (fewer TLB misses; tracemalloc still counts
 *       it). Methods: or_bits(keys, bits), clear_bits(keys, bits), values(keys) -> native
 *       uint64 bytes (0: absent), items(), len(). The reference is accel.KeyMasksPy (a dict).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#ifndef _WIN32
#include <dlfcn.h>
#include <sys/mman.h>
#define RELAYKV_HAVE_DLOPEN 1
#define RELAYKV_POSIX 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KM_PREFETCH(p) __builtin_prefetch(p)
#else
#define KM_PREFETCH(p) ((void)(p))
#endif
#define INT32_PREFETCH 48 /* items ahead whose int objects int32_bytes prefetches */

/* xxhash's XXH128_hash_t and XXH3_128bits (xxhash.h, stable since 0.8.0). */
typedef struct {
    uint64_t low64;
    uint64_t high64;
} xxh128_value;
typedef xxh128_value (*xxh3_128_fn)(const void *data, size_t len);
static xxh3_128_fn direct_xxh3 = NULL;
static PyObject *direct_digest = NULL; /* the callable direct_xxh3 was checked against */

/* Item i of a PySequence_Fast list/tuple, re-read on every step: the Python code an odd item
 * runs (__index__, __eq__) may resize a list under us. NULL (RuntimeError) if it shrank. */
static PyObject *
item_at(PyObject *seq, Py_ssize_t i)
{
    if (i >= PySequence_Fast_GET_SIZE(seq)) {
        PyErr_SetString(PyExc_RuntimeError, "sequence changed size while being read");
        return NULL;
    }
    return PySequence_Fast_GET_ITEM(seq, i);
}

/* `obj` as a PySequence_Fast (new reference) and, in *out, a bytes object of `width` bytes
 * per item to fill; NULL (exception set, nothing held) on failure. */
static PyObject *
sequence_and_output(PyObject *obj, const char *message, Py_ssize_t width, PyObject **out)
{
    PyObject *seq = PySequence_Fast(obj, message);
    if (seq == NULL) {
        return NULL;
    }
    *out = PyBytes_FromStringAndSize(NULL, PySequence_Fast_GET_SIZE(seq) * width);
    if (*out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    return seq;
}

/* Drop `seq`; return `out` if `ok` and the sequence kept its size, else drop it too. */
static PyObject *
finish(PyObject *seq, Py_ssize_t n, PyObject *out, int ok)
{
    if (ok && PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_SetString(PyExc_RuntimeError, "sequence changed size while being read");
        ok = 0;
    }
    Py_DECREF(seq);
    if (!ok) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* mapping[key] (an int in [0, 2**64)) in *v, 0 where absent; 0, or -1 with an exception set.
 * The key is held until its value is read: the Python code its lookup runs (__hash__,
 * __eq__) may leave us its last reference, and dropping that (its __del__) may drop the
 * value. */
static int
lookup_u64(PyObject *mapping, PyObject *key, uint64_t *v)
{
    int rc = 0;
    *v = 0;
    Py_INCREF(key);
    PyObject *value = PyDict_GetItemWithError(mapping, key); /* borrowed */
    if (value == NULL) {
        rc = PyErr_Occurred() ? -1 : 0;
    }
    else if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "values_u64: values must be ints");
        rc = -1;
    }
    else {
        unsigned long long u = PyLong_AsUnsignedLongLong(value);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            rc = -1;
        }
        else {
            *v = (uint64_t)u;
        }
    }
    Py_DECREF(key);
    return rc;
}

static int
bad_token(PyObject *item, Py_ssize_t i)
{
    PyErr_Format(PyExc_TypeError, "token id at position %zd is not an integer: %.100s",
                 i, Py_TYPE(item)->tp_name);
    return -1;
}

/* The value of one token id, or -1 with an exception set (OverflowError outside int32).
 * `strict`: only exact ints (a JSON body's ids), no bools or other __index__ types. */
static int
token_value(PyObject *item, Py_ssize_t i, int strict, int32_t *out)
{
    int overflow = 0;
    long v;
    if (strict && !PyLong_CheckExact(item)) {
        return bad_token(item, i);
    }
    if (PyLong_Check(item)) {
        v = PyLong_AsLongAndOverflow(item, &overflow);
    }
    else {
        PyObject *index = PyNumber_Index(item);
        if (index == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                return -1;
            }
            PyErr_Clear();
            return bad_token(item, i);
        }
        v = PyLong_AsLongAndOverflow(index, &overflow);
        Py_DECREF(index);
    }
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError,
                     "token id %R at position %zd is outside int32 [-2**31, 2**31)", item, i);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* An exact int of at most one digit (below 2**30 in magnitude, so within int32): its value in
 * *out and 1; else 0 (the general path reads it). */
static inline int
compact_int(PyObject *item, int32_t *out)
{
    if (!PyLong_CheckExact(item)) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)item)) {
        return 0;
    }
    *out = (int32_t)PyUnstable_Long_CompactValue((PyLongObject *)item);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(item);
    if (size < -1 || size > 1) {
        return 0;
    }
    *out = size == 0 ? 0 : (int32_t)(size * (Py_ssize_t)((PyLongObject *)item)->ob_digit[0]);
    return 1;
#endif
}

static inline void
store_le32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &u, 4);
#else
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
#endif
}

static PyObject *
int32_bytes(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "int32_bytes(tokens, strict=False) takes 1 or 2 "
                                         "positional arguments");
        return NULL;
    }
    PyObject *tokens = args[0];
    int strict = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    if (strict < 0) {
        return NULL;
    }
    PyObject *out;
    PyObject *seq = sequence_and_output(tokens, "token ids must be a list or tuple of integers",
                                        4, &out);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    /* Exact ints of one digit, read straight from the items array: no Python code runs in
     * this loop, so the sequence cannot change under it. The first other item ends it. The
     * int objects a few dozen items ahead are prefetched (a 64k-token body's ints span
     * about 2 MB, beyond the core's own caches). */
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        int32_t v;
        if (i + INT32_PREFETCH < n) {
            KM_PREFETCH(items[i + INT32_PREFETCH]);
        }
        if (!compact_int(items[i], &v)) {
            break;
        }
        store_le32(p, v);
        p += 4;
    }
    for (; i < n; i++) {
        PyObject *item = item_at(seq, i);
        int32_t v;
        if (item == NULL) {
            goto fail;
        }
        if (compact_int(item, &v)) { /* no Python code runs: no reference needed */
            store_le32(p, v);
            p += 4;
            continue;
        }
        Py_INCREF(item);
        int rc = token_value(item, i, strict, &v);
        Py_DECREF(item);
        if (rc < 0) {
            goto fail;
        }
        store_le32(p, v);
        p += 4;
    }
    return finish(seq, n, out, 1);
fail:
    return finish(seq, n, out, 0);
}

/* XXH128_canonicalFromHash: the digest's bytes, big-endian high then low half, as xxhash's
 * xxh3_128_digest returns them. */
static inline void
canonical(xxh128_value h, unsigned char *b)
{
#if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* two 8-byte stores: the chain's next hash reads these bytes back at once, and a load
     * spanning several narrower stores is not forwarded from them (it waits for the cache) */
    uint64_t hi = __builtin_bswap64(h.high64), lo = __builtin_bswap64(h.low64);
    memcpy(b, &hi, 8);
    memcpy(b + 8, &lo, 8);
#else
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(h.high64 >> (56 - 8 * i));
        b[8 + i] = (unsigned char)(h.low64 >> (56 - 8 * i));
    }
#endif
}

/* `chain` with direct_xxh3: every unit's material is built in one reused buffer (the previous
 * digest, the first unit's extra, the unit's bytes), so the only objects made are the
 * hashes. Fills every item of `out`; 0 with an exception set on failure. */
static int
chain_direct(PyObject *out, const char *src, Py_ssize_t units, Py_ssize_t step,
             PyObject *parent, PyObject *extra)
{
    Py_ssize_t plen = PyBytes_GET_SIZE(parent), elen = PyBytes_GET_SIZE(extra);
    Py_ssize_t head = plen > 16 ? plen : 16;
    unsigned char *buf = PyMem_Malloc((size_t)(head + elen + step));
    if (buf == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    memcpy(buf, PyBytes_AS_STRING(parent), plen);
    memcpy(buf + plen, PyBytes_AS_STRING(extra), elen);
    Py_ssize_t len = plen + elen; /* the first unit's material: parent + extra + unit */
    for (Py_ssize_t k = 0; k < units; k++) {
        memcpy(buf + len, src + k * step, step);
        canonical(direct_xxh3(buf, (size_t)(len + step)), buf);
        PyObject *h = PyBytes_FromStringAndSize((const char *)buf, 16);
        if (h == NULL) {
            PyMem_Free(buf);
            return 0;
        }
        PyList_SET_ITEM(out, k, h);
        len = 16; /* later units: the previous digest + unit */
    }
    PyMem_Free(buf);
    return 1;
}

#define XXH3_CHECK_MAX 8500

static PyObject *
bind_xxh3(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "bind_xxh3(path, digest) takes a str and a callable");
        return NULL;
    }
#ifdef RELAYKV_HAVE_DLOPEN
    const char *path = PyUnicode_AsUTF8(args[0]);
    if (path == NULL) {
        return NULL;
    }
    /* xxhash's module is loaded already; RTLD_NOLOAD never loads anything new. The handle
     * is kept: the module is never unloaded while its function is in use. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        Py_RETURN_FALSE;
    }
    xxh3_128_fn fn = (xxh3_128_fn)dlsym(lib, "XXH3_128bits");
    unsigned (*version)(void) = (unsigned (*)(void))dlsym(lib, "XXH_versionNumber");
    if (fn == NULL || version == NULL || version() < 800) {
        dlclose(lib);
        Py_RETURN_FALSE;
    }
    /* every length to 300 (each of XXH3's short-input paths), then lengths to 8,500 in
     * steps of 97 (the long path: stripes, several 1,024-byte blocks, every tail length) */
    static unsigned char input[XXH3_CHECK_MAX];
    unsigned char expected[16];
    for (int i = 0; i < XXH3_CHECK_MAX; i++) {
        input[i] = (unsigned char)(i * 131 + 7 + (i >> 8));
    }
    for (Py_ssize_t n = 0; n <= XXH3_CHECK_MAX; n += n < 300 ? 1 : 97) {
        PyObject *arg = PyBytes_FromStringAndSize((const char *)input, n);
        PyObject *want = arg == NULL ? NULL : PyObject_CallOneArg(args[1], arg);
        Py_XDECREF(arg);
        if (want == NULL) {
            dlclose(lib);
            return NULL;
        }
        canonical(fn(input, (size_t)n), expected);
        int same = PyBytes_Check(want) && PyBytes_GET_SIZE(want) == 16 &&
                   memcmp(PyBytes_AS_STRING(want), expected, 16) == 0;
        Py_DECREF(want);
        if (!same) {
            dlclose(lib);
            Py_RETURN_FALSE;
        }
    }
    Py_INCREF(args[1]);
    Py_XSETREF(direct_digest, args[1]);
    direct_xxh3 = fn;
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

/* An integer argument as Py_ssize_t: 0 with the exception set when it is not one. */
static int
as_ssize(PyObject *obj, Py_ssize_t *out)
{
    *out = PyLong_AsSsize_t(obj);
    return !(*out == -1 && PyErr_Occurred());
}

static PyObject *
chain(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "chain(data, step, parent, first_extra, digest) takes 5 arguments");
        return NULL;
    }
    PyObject *digest = args[4];
    if (!PyBytes_Check(args[2]) || !PyBytes_Check(args[3]) || !PyCallable_Check(digest)) {
        PyErr_SetString(PyExc_TypeError,
                        "chain: parent and first_extra must be bytes, digest callable");
        return NULL;
    }
    Py_ssize_t step;
    if (!as_ssize(args[1], &step)) {
        return NULL;
    }
    if (step <= 0) {
        PyErr_SetString(PyExc_ValueError, "chain: step must be > 0");
        return NULL;
    }
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Py_ssize_t units = data.len / step;
    PyObject *out = PyList_New(units);
    if (out == NULL || units == 0) { /* no full unit: no buffer of a unit's size either */
        PyBuffer_Release(&data);
        return out;
    }
    const char *src = (const char *)data.buf;
    if (direct_xxh3 != NULL && digest == direct_digest) {
        int ok = chain_direct(out, src, units, step, args[2], args[3]);
        PyBuffer_Release(&data);
        if (!ok) {
            Py_DECREF(out);
            return NULL;
        }
        return out;
    }
    /* The previous hash, borrowed from `parent` or from `out` (which owns it). */
    PyObject *prev = args[2];
    for (Py_ssize_t k = 0; k < units; k++) {
        PyObject *extra = k == 0 ? args[3] : NULL;
        Py_ssize_t hlen = PyBytes_GET_SIZE(prev);
        Py_ssize_t elen = extra != NULL ? PyBytes_GET_SIZE(extra) : 0;
        PyObject *material = PyBytes_FromStringAndSize(NULL, hlen + elen + step);
        if (material == NULL) {
            goto fail;
        }
        char *m = PyBytes_AS_STRING(material);
        memcpy(m, PyBytes_AS_STRING(prev), hlen);
        if (elen) {
            memcpy(m + hlen, PyBytes_AS_STRING(extra), elen);
        }
        memcpy(m + hlen + elen, src + k * step, step);
        PyObject *h = PyObject_CallOneArg(digest, material);
        Py_DECREF(material);
        if (h == NULL) {
            goto fail;
        }
        if (!PyBytes_CheckExact(h)) {
            Py_DECREF(h);
            PyErr_SetString(PyExc_TypeError, "chain: digest must return bytes");
            goto fail;
        }
        PyList_SET_ITEM(out, k, h);
        prev = h;
    }
    PyBuffer_Release(&data);
    return out;
fail:
    PyBuffer_Release(&data);
    Py_DECREF(out); /* unset items are NULL, which list_dealloc skips */
    return NULL;
}

static PyObject *
values_u64(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "values_u64(mapping, keys) takes 2 arguments");
        return NULL;
    }
    PyObject *mapping = args[0];
    if (!PyDict_Check(mapping)) {
        PyErr_SetString(PyExc_TypeError, "values_u64: mapping must be a dict");
        return NULL;
    }
    PyObject *out;
    PyObject *seq = sequence_and_output(args[1], "values_u64: keys must be a list or tuple", 8,
                                        &out);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char *p = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = item_at(seq, i);
        uint64_t v;
        if (key == NULL || lookup_u64(mapping, key, &v) < 0) {
            goto fail;
        }
        memcpy(p + 8 * i, &v, 8);
    }
    return finish(seq, n, out, 1);
fail:
    return finish(seq, n, out, 0);
}


/* ---- KeyMasks -------------------------------------------------------------------------- */

typedef struct {
    uint64_t k0, k1, mask; /* mask 0: an empty slot */
} km_slot;

typedef struct {
    PyObject_HEAD
    km_slot *slots;
    size_t cap; /* a power of two (0 before the first key) */
    size_t used;
    uint64_t s0, s1;
    PyObject *odd; /* keys that are not 16-byte bytes: key -> mask */
} KeyMasks;

#ifndef KM_BATCH
#define KM_BATCH 16
#endif

static inline int
km_key(PyObject *key, uint64_t *k0, uint64_t *k1)
{
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != 16) {
        return 0;
    }
    if (!PyBytes_CheckExact(key) && (Py_TYPE(key)->tp_hash != PyBytes_Type.tp_hash ||
                                     Py_TYPE(key)->tp_richcompare != PyBytes_Type.tp_richcompare)) {
        return 0; /* its own __hash__ or __eq__: the dict beside the table decides */
    }
    const char *p = PyBytes_AS_STRING(key);
    memcpy(k0, p, 8);
    memcpy(k1, p + 8, 8);
    return 1;
}

static inline size_t
km_home(const KeyMasks *t, uint64_t k0, uint64_t k1)
{
    uint64_t h = (k0 ^ t->s0) + (k1 ^ t->s1) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBULL;
    h ^= h >> 31;
    return (size_t)h & (t->cap - 1);
}

/* The slot holding the key, or the empty slot ending its probe run (cap > 0). */
static inline size_t
km_find(const KeyMasks *t, size_t i, uint64_t k0, uint64_t k1)
{
    size_t m = t->cap - 1;
    while (t->slots[i].mask != 0 && (t->slots[i].k0 != k0 || t->slots[i].k1 != k1)) {
        i = (i + 1) & m;
    }
    return i;
}

/* A zeroed slot array. A table of 2 MiB or more is placed on 2 MiB boundaries and, on Linux,
 * offered transparent huge pages: a prompt's probes land anywhere in it, and with 4 KiB pages
 * nearly every probe also misses the TLB (a page walk before the cache miss). */
#define KM_HUGE ((size_t)2 << 20)
#define KM_TRACE_DOMAIN 0x726b76u /* tracemalloc counts the tables ("rkv"), as numpy's arrays */
static km_slot *
km_alloc(size_t cap)
{
    size_t size = cap * sizeof(km_slot);
    void *p = NULL;
#ifdef RELAYKV_POSIX
    if (size >= KM_HUGE) {
        if (posix_memalign(&p, KM_HUGE, size) != 0) {
            return NULL;
        }
#ifdef MADV_HUGEPAGE
        (void)madvise(p, size, MADV_HUGEPAGE); /* advice only: nothing depends on it */
#endif
        memset(p, 0, size);
    }
#endif
    if (p == NULL) {
        p = calloc(cap, sizeof(km_slot));
        if (p == NULL) {
            return NULL;
        }
    }
    (void)PyTraceMalloc_Track(KM_TRACE_DOMAIN, (uintptr_t)p, size);
    return (km_slot *)p;
}

static void
km_free(km_slot *slots)
{
    if (slots != NULL) {
        (void)PyTraceMalloc_Untrack(KM_TRACE_DOMAIN, (uintptr_t)slots);
        free(slots);
    }
}

static int
km_resize(KeyMasks *t, size_t cap)
{
    km_slot *slots = km_alloc(cap);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    km_slot *old = t->slots;
    size_t old_cap = t->cap;
    t->slots = slots;
    t->cap = cap;
    for (size_t j = 0; j < old_cap; j++) {
        if (old[j].mask != 0) {
            size_t i = km_find(t, km_home(t, old[j].k0, old[j].k1), old[j].k0, old[j].k1);
            t->slots[i] = old[j];
        }
    }
    km_free(old);
    return 0;
}

/* Empty slot i, moving later slots of its run back (linear probing stays exact). */
static void
km_delete(KeyMasks *t, size_t i)
{
    size_t m = t->cap - 1, j = i;
    for (;;) {
        j = (j + 1) & m;
        if (t->slots[j].mask == 0) {
            break;
        }
        size_t k = km_home(t, t->slots[j].k0, t->slots[j].k1);
        /* slot j stays where it is when its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].mask = 0;
    t->used--;
}

static PyObject *
km_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_buffer seed;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "KeyMasks(seed) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*:KeyMasks", &seed)) {
        return NULL;
    }
    if (seed.len != 16) {
        PyBuffer_Release(&seed);
        PyErr_SetString(PyExc_ValueError, "KeyMasks: seed must be 16 bytes");
        return NULL;
    }
    KeyMasks *t = (KeyMasks *)type->tp_alloc(type, 0);
    if (t == NULL) {
        PyBuffer_Release(&seed);
        return NULL;
    }
    memcpy(&t->s0, seed.buf, 8);
    memcpy(&t->s1, (const char *)seed.buf + 8, 8);
    PyBuffer_Release(&seed);
    t->odd = PyDict_New();
    if (t->odd == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

/* The collector's view: only the dict of odd keys holds objects (a key may refer back to its
 * table). Clearing empties that dict and keeps it, so every method still finds one. */
static int
km_traverse(KeyMasks *t, visitproc visit, void *arg)
{
    Py_VISIT(t->odd);
    return 0;
}

static int
km_clear(KeyMasks *t)
{
    if (t->odd != NULL) {
        PyDict_Clear(t->odd);
    }
    return 0;
}

static void
km_dealloc(KeyMasks *t)
{
    PyObject_GC_UnTrack(t);
    km_free(t->slots);
    Py_XDECREF(t->odd);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
km_len(KeyMasks *t)
{
    return (Py_ssize_t)t->used + PyDict_GET_SIZE(t->odd);
}

static int
km_bits_arg(PyObject *obj, uint64_t *bits)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *bits = (uint64_t)v;
    return 0;
}

/* mask |= bits (set) or mask &= ~bits (clear, removing a key left with none) in the dict of
 * odd keys. */
static int
km_odd_update(KeyMasks *t, PyObject *key, uint64_t bits, int set)
{
    PyObject *value = PyDict_GetItemWithError(t->odd, key); /* borrowed */
    if (value == NULL && PyErr_Occurred()) {
        return -1;
    }
    uint64_t mask = 0;
    if (value != NULL && km_bits_arg(value, &mask) < 0) {
        return -1;
    }
    mask = set ? mask | bits : mask & ~bits;
    if (mask == 0) {
        return value == NULL ? 0 : PyDict_DelItem(t->odd, key);
    }
    PyObject *m = PyLong_FromUnsignedLongLong(mask);
    if (m == NULL) {
        return -1;
    }
    int rc = PyDict_SetItem(t->odd, key, m);
    Py_DECREF(m);
    return rc;
}

static PyObject *
km_update(KeyMasks *t, PyObject *const *args, Py_ssize_t nargs, int set)
{
    uint64_t bits;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "takes (keys, bits)");
        return NULL;
    }
    if (km_bits_arg(args[1], &bits) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "keys must be a list or tuple");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; bits != 0 && i < n; i++) {
        PyObject *key = item_at(seq, i);
        uint64_t k0, k1;
        if (key == NULL) {
            goto fail;
        }
        if (!km_key(key, &k0, &k1)) {
            Py_INCREF(key);
            int rc = km_odd_update(t, key, bits, set);
            Py_DECREF(key);
            if (rc < 0) {
                goto fail;
            }
            continue;
        }
        if (set) {
            if (2 * (t->used + 1) > t->cap && km_resize(t, t->cap ? 2 * t->cap : 64) < 0) {
                goto fail;
            }
            size_t j = km_find(t, km_home(t, k0, k1), k0, k1);
            if (t->slots[j].mask == 0) {
                t->slots[j].k0 = k0;
                t->slots[j].k1 = k1;
                t->used++;
            }
            t->slots[j].mask |= bits;
        }
        else if (t->cap) {
            size_t j = km_find(t, km_home(t, k0, k1), k0, k1);
            if (t->slots[j].mask != 0) {
                t->slots[j].mask &= ~bits;
                if (t->slots[j].mask == 0) {
                    km_delete(t, j);
                }
            }
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyObject *
km_or_bits(KeyMasks *t, PyObject *const *args, Py_ssize_t nargs)
{
    return km_update(t, args, nargs, 1);
}

static PyObject *
km_clear_bits(KeyMasks *t, PyObject *const *args, Py_ssize_t nargs)
{
    return km_update(t, args, nargs, 0);
}

static PyObject *
km_values(KeyMasks *t, PyObject *keys)
{
    PyObject *out;
    PyObject *seq = sequence_and_output(keys, "keys must be a list or tuple", 8, &out);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char *p = PyBytes_AS_STRING(out);
    size_t home[KM_BATCH];
    uint64_t key0[KM_BATCH], key1[KM_BATCH];
    int inline_key[KM_BATCH];
    for (Py_ssize_t start = 0; start < n; start += KM_BATCH) {
        Py_ssize_t count = n - start < KM_BATCH ? n - start : KM_BATCH;
        /* first every slot of the batch is asked for, then each is read; an odd key's lookup
         * runs Python code, which may grow the table: the later homes are then placed anew */
        size_t cap = t->cap;
        for (Py_ssize_t b = 0; b < count; b++) {
            PyObject *key = item_at(seq, start + b);
            if (key == NULL) {
                goto fail;
            }
            inline_key[b] = km_key(key, &key0[b], &key1[b]);
            if (inline_key[b] && t->cap) {
                home[b] = km_home(t, key0[b], key1[b]);
                KM_PREFETCH(&t->slots[home[b]]);
            }
        }
        for (Py_ssize_t b = 0; b < count; b++) {
            uint64_t v = 0;
            if (inline_key[b]) {
                if (t->cap) {
                    size_t i = t->cap == cap ? home[b] : km_home(t, key0[b], key1[b]);
                    v = t->slots[km_find(t, i, key0[b], key1[b])].mask;
                }
            }
            else { /* hashed even when no odd key is held: an unhashable key is refused */
                PyObject *key = item_at(seq, start + b);
                if (key == NULL || lookup_u64(t->odd, key, &v) < 0) {
                    goto fail;
                }
            }
            memcpy(p + 8 * (start + b), &v, 8);
        }
    }
    return finish(seq, n, out, 1);
fail:
    return finish(seq, n, out, 0);
}

static PyObject *
km_items(KeyMasks *t, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (size_t j = 0; j < t->cap; j++) {
        if (t->slots[j].mask == 0) {
            continue;
        }
        char raw[16];
        memcpy(raw, &t->slots[j].k0, 8);
        memcpy(raw + 8, &t->slots[j].k1, 8);
        PyObject *item = Py_BuildValue("(y#K)", raw, (Py_ssize_t)16,
                                       (unsigned long long)t->slots[j].mask);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *odd = PyDict_Items(t->odd);
    if (odd == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    Py_ssize_t start = PyList_GET_SIZE(out);
    int rc = PyList_SetSlice(out, start, start, odd);
    Py_DECREF(odd);
    if (rc < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyMethodDef km_methods[] = {
    {"or_bits", (PyCFunction)(void (*)(void))km_or_bits, METH_FASTCALL,
     "or_bits(keys, bits): each key's mask |= bits"},
    {"clear_bits", (PyCFunction)(void (*)(void))km_clear_bits, METH_FASTCALL,
     "clear_bits(keys, bits): each key's mask &= ~bits; a key left with 0 is removed"},
    {"values", (PyCFunction)km_values, METH_O,
     "values(keys) -> native uint64 bytes of each key's mask (0: absent)"},
    {"items", (PyCFunction)km_items, METH_NOARGS, "items() -> list of (key, mask)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods km_as_sequence = {
    .sq_length = (lenfunc)km_len,
};

static PyTypeObject KeyMasksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "relaykv.kvcache._accel.KeyMasks",
    .tp_basicsize = sizeof(KeyMasks),
    .tp_dealloc = (destructor)km_dealloc,
    .tp_as_sequence = &km_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)km_traverse,
    .tp_clear = (inquiry)km_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = "KeyMasks(seed): keys -> non-zero uint64 bitmasks (see the module docstring)",
    .tp_methods = km_methods,
    .tp_new = km_new,
};

#if defined(__GNUC__) || defined(__clang__)
#define LOWEST_BIT(x) __builtin_ctzll(x)
#else
static inline int
LOWEST_BIT(uint64_t x)
{
    int b = 0;
    while (!(x & 1)) {
        x >>= 1;
        b++;
    }
    return b;
}
#endif

static PyObject *
slot_counts(PyObject *Py_UNUSED(module), PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "slot_counts: masks must be whole uint64 values");
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    const char *p = (const char *)view.buf;
    Py_ssize_t held[64] = {0}, runs[64];
    uint64_t all = ~(uint64_t)0; /* the slots holding every key so far */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t m;
        memcpy(&m, p + 8 * i, 8);
        for (uint64_t ended = all & ~m; ended; ended &= ended - 1) {
            runs[LOWEST_BIT(ended)] = i;
        }
        all &= m;
        for (; m; m &= m - 1) {
            held[LOWEST_BIT(m)]++;
        }
    }
    for (; all; all &= all - 1) {
        runs[LOWEST_BIT(all)] = n;
    }
    PyBuffer_Release(&view);
    PyObject *h = PyList_New(64), *r = PyList_New(64), *out = PyTuple_New(2);
    if (h == NULL || r == NULL || out == NULL) {
        goto fail;
    }
    for (int b = 0; b < 64; b++) {
        PyObject *x = PyLong_FromSsize_t(held[b]);
        if (x == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(h, b, x);
        x = PyLong_FromSsize_t(runs[b]);
        if (x == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(r, b, x);
    }
    PyTuple_SET_ITEM(out, 0, h);
    PyTuple_SET_ITEM(out, 1, r);
    return out;
fail:
    Py_XDECREF(h);
    Py_XDECREF(r);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *
slot_reused(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "slot_reused(masks, slot, start, stop, peek) takes 5 arguments");
        return NULL;
    }
    Py_ssize_t slot;
    if (!as_ssize(args[1], &slot)) {
        return NULL;
    }
    Py_ssize_t start;
    if (!as_ssize(args[2], &start)) {
        return NULL;
    }
    Py_ssize_t stop;
    if (!as_ssize(args[3], &stop)) {
        return NULL;
    }
    int peek = PyObject_IsTrue(args[4]);
    if (peek < 0) {
        return NULL;
    }
    if (slot < 0 || slot > 63) {
        PyErr_SetString(PyExc_ValueError, "slot_reused: slot must be in [0, 64)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Py_ssize_t n = view.len / 8;
    if (view.len % 8 != 0 || start < 0 || stop > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "slot_reused: masks must be whole uint64 values, "
                                          "0 <= start and stop <= len(masks)");
        return NULL;
    }
    Py_ssize_t count = stop > start ? stop - start : 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 8);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const char *p = (const char *)view.buf;
    char *q = PyBytes_AS_STRING(out);
    Py_ssize_t found = 0;
    uint64_t next = 0; /* bit `slot` of mask k + 1 (0 past the buffer) */
    if (count) {
        uint64_t m;
        memcpy(&m, p + 8 * start, 8);
        next = (m >> slot) & 1;
    }
    for (Py_ssize_t k = start; k < stop; k++) {
        uint64_t here = next;
        next = 0;
        if (k + 1 < n) {
            uint64_t m;
            memcpy(&m, p + 8 * (k + 1), 8);
            next = (m >> slot) & 1;
        }
        if (here && (!peek || next)) {
            int64_t v = (int64_t)k;
            memcpy(q + 8 * found, &v, 8);
            found++;
        }
    }
    PyBuffer_Release(&view);
    if (found != count && _PyBytes_Resize(&out, found * 8) < 0) {
        return NULL;
    }
    return out;
}

/* One group of units_covered: unit j is covered when block (j * unit) / block_size is among
 * `indices`; clears the flags of `cov` (one per unit) of the units it does not cover. 0 with
 * an exception set on failure. */
static int
cover_group(unsigned char *cov, Py_ssize_t unit, Py_ssize_t units, PyObject *group)
{
    if (!PyTuple_Check(group) || PyTuple_GET_SIZE(group) != 2) {
        PyErr_SetString(PyExc_TypeError, "units_covered: groups must be (block_size, indices)");
        return 0;
    }
    Py_ssize_t block_size;
    if (!as_ssize(PyTuple_GET_ITEM(group, 0), &block_size)) {
        return 0;
    }
    if (block_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "units_covered: block_size must be > 0");
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(group, 1), &view, PyBUF_SIMPLE) < 0) {
        return 0;
    }
    if (view.len % 8 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "units_covered: indices must be whole int64 values");
        return 0;
    }
    /* the blocks units start in: 0 .. (units - 1) * unit / block_size (no overflow: the
     * caller checked units * unit) */
    Py_ssize_t blocks = (units - 1) * unit / block_size + 1;
    unsigned char *reused = PyMem_Calloc((size_t)blocks, 1);
    if (reused == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return 0;
    }
    const char *p = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < view.len / 8; i++) {
        int64_t k;
        memcpy(&k, p + 8 * i, 8);
        if (k >= 0 && k < (int64_t)blocks) {
            reused[k] = 1;
        }
    }
    PyBuffer_Release(&view);
    if (block_size == unit) {
        for (Py_ssize_t j = 0; j < units; j++) {
            cov[j] &= reused[j];
        }
    }
    else {
        for (Py_ssize_t j = 0; j < units; j++) {
            cov[j] &= reused[j * unit / block_size];
        }
    }
    PyMem_Free(reused);
    return 1;
}

static PyObject *
units_covered(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "units_covered(unit, units, groups) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t unit;
    if (!as_ssize(args[0], &unit)) {
        return NULL;
    }
    Py_ssize_t units;
    if (!as_ssize(args[1], &units)) {
        return NULL;
    }
    if (unit <= 0 || units < 0 || units > PY_SSIZE_T_MAX / unit) {
        PyErr_SetString(PyExc_ValueError, "units_covered: unit must be > 0, units >= 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[2], "units_covered: groups must be a list or tuple");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    unsigned char *cov = PyMem_Malloc(units > 0 ? (size_t)units : 1);
    if (cov == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    memset(cov, 1, (size_t)units);
    for (Py_ssize_t g = 0; g < n && units > 0; g++) {
        PyObject *group = PySequence_Fast_GET_ITEM(seq, g);
        Py_INCREF(group); /* held while its buffer is read */
        int ok = cover_group(cov, unit, units, group);
        Py_DECREF(group);
        if (!ok) {
            PyMem_Free(cov);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    Py_ssize_t count = 0;
    for (Py_ssize_t j = 0; j < units; j++) {
        count += cov[j];
    }
    PyMem_Free(cov);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"slot_counts", (PyCFunction)slot_counts, METH_O,
     "slot_counts(masks) -> (held, runs): per engine slot, keys held and the run from key 0"},
    {"int32_bytes", (PyCFunction)(void (*)(void))int32_bytes, METH_FASTCALL,
     "int32_bytes(tokens, strict=False) -> little-endian int32 bytes of token ids"},
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "chain(data, step, parent, first_extra, digest) -> list of chained unit hashes"},
    {"bind_xxh3", (PyCFunction)(void (*)(void))bind_xxh3, METH_FASTCALL,
     "bind_xxh3(path, digest) -> whether chain calls xxhash's XXH3_128bits directly"},
    {"slot_reused", (PyCFunction)(void (*)(void))slot_reused, METH_FASTCALL,
     "slot_reused(masks, slot, start, stop, peek) -> native int64 bytes of reused indices"},
    {"units_covered", (PyCFunction)(void (*)(void))units_covered, METH_FASTCALL,
     "units_covered(unit, units, groups) -> units starting in a reused block of every group"},
    {"values_u64", (PyCFunction)(void (*)(void))values_u64, METH_FASTCALL,
     "values_u64(mapping, keys) -> native uint64 bytes of mapping.get(key, 0) per key"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "relaykv.kvcache._accel",
    "C accelerator of relaykv.kvcache (optional; see accel.py)", -1, methods,
};

PyMODINIT_FUNC
PyInit__accel(void)
{
    if (PyType_Ready(&KeyMasksType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&KeyMasksType);
    if (PyModule_AddObject(m, "KeyMasks", (PyObject *)&KeyMasksType) < 0) {
        Py_DECREF(&KeyMasksType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
