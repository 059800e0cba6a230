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
 *       inputs of every length 0..300. False (and `chain` keeps calling `digest`) otherwise:
 *       a build of xxhash that does not export the symbol, or a platform without dlopen.
 *
 *   values_u64(mapping, keys) -> bytes
 *       Per key, mapping[key] (a dict of non-negative ints below 2**64) as native uint64, 0
 *       where the key is absent: a router's pass over a prompt's keys in the map of which
 *       engines hold each key (relaykv.router.holders), without a Python call per key.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifndef _WIN32
#include <dlfcn.h>
#define RELAYKV_HAVE_DLOPEN 1
#endif

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
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
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
    for (Py_ssize_t i = 0; i < n; i++) {
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
static void
canonical(xxh128_value h, unsigned char *b)
{
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(h.high64 >> (56 - 8 * i));
        b[8 + i] = (unsigned char)(h.low64 >> (56 - 8 * i));
    }
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
    unsigned char input[300], expected[16];
    for (int i = 0; i < 300; i++) {
        input[i] = (unsigned char)(i * 131 + 7);
    }
    for (Py_ssize_t n = 0; n <= 300; n++) {
        PyObject *arg = PyBytes_FromStringAndSize((const char *)input, n);
        if (arg == NULL) {
            return NULL;
        }
        PyObject *want = PyObject_CallOneArg(args[1], arg);
        Py_DECREF(arg);
        if (want == NULL) {
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
    Py_ssize_t step = PyLong_AsSsize_t(args[1]);
    if (step == -1 && PyErr_Occurred()) {
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
    if (out == NULL) {
        PyBuffer_Release(&data);
        return NULL;
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
        unsigned long long v = 0;
        if (key == NULL) {
            goto fail;
        }
        Py_INCREF(key);
        PyObject *value = PyDict_GetItemWithError(mapping, key); /* borrowed */
        Py_DECREF(key);
        if (value == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
        }
        else {
            if (!PyLong_Check(value)) {
                PyErr_SetString(PyExc_TypeError, "values_u64: values must be ints");
                goto fail;
            }
            v = PyLong_AsUnsignedLongLong(value);
            if (v == (unsigned long long)-1 && PyErr_Occurred()) {
                goto fail;
            }
        }
        uint64_t u = (uint64_t)v;
        memcpy(p + 8 * i, &u, 8);
    }
    return finish(seq, n, out, 1);
fail:
    return finish(seq, n, out, 0);
}

static PyMethodDef methods[] = {
    {"int32_bytes", (PyCFunction)(void (*)(void))int32_bytes, METH_FASTCALL,
     "int32_bytes(tokens, strict=False) -> little-endian int32 bytes of token ids"},
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "chain(data, step, parent, first_extra, digest) -> list of chained unit hashes"},
    {"bind_xxh3", (PyCFunction)(void (*)(void))bind_xxh3, METH_FASTCALL,
     "bind_xxh3(path, digest) -> whether chain calls xxhash's XXH3_128bits directly"},
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
    return PyModule_Create(&module);
}
