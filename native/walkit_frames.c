/*
 * walkit_frames.c - bookie._frames: journal ENTRY frames packed in C.
 *
 * Theory of operation
 * -------------------
 * A journal record is framed in the producer's thread (bookie/journal/_framing.py):
 * a 12-byte frame header, the ids, the payload, and a CRC32C over all of it but the CRC
 * field, seeded with the journal file's id (docs/format.md, "Journal"). In Python that
 * is a struct pack, a slice assignment, a memoryview slice and a crc32c call per record:
 * about 0.8 us of interpreter time for a 1 KiB entry, which is most of a journal
 * producer's cost and, since CPython runs one thread's bytecode at a time, most of
 * what bounds the journal's throughput. Here the same bytes are written by one call
 * per record (frame_entry: Journal.log_entry's whole framing, no other call on its path)
 * or per received chunk (frame_entries).
 *
 * The Python code stays the reference: this module frames only what it can frame
 * exactly as FrameBuffer does - ids that fit (ledger id u64, entry id i64) and payloads
 * that are one-dimensional, C-contiguous byte buffers (bytes, bytearray, memoryview of
 * format 'B' whose len() is their size). Anything else is handed back ("not here") and
 * FrameBuffer frames that record in Python, which raises the same error it always
 * raised. Room is the caller's: a frame that would end past ``limit`` is not written
 * ("no room", with the frame's size), the caller closes the buffer (padding) and goes
 * on in another one of that size at least. An exception that is not an Exception
 * (KeyboardInterrupt from a signal handler run inside an id's __index__) propagates.
 *
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78) uses the SSE4.2 crc32
 * instruction. Runs go in three independent lanes of BLOCK bytes (the instruction's
 * latency is three times its throughput), then of MID and of SHORT bytes (a 1 KiB
 * entry's frame: one round of MID lanes and one of SHORT), whose states are joined by
 * multiplying by x^(8*lane) modulo the polynomial - four lookups in a table made at
 * import: the CRC register is linear, so the state after A then B is shift(state after
 * A, |B|) xor (B's CRC from state 0). Without
 * SSE4.2 (another CPU, another architecture, a big-endian host) HARDWARE_CRC is 0 and
 * FrameBuffer keeps its Python path: there is no second software CRC here.
 *
 * The GIL is held throughout (the calls are short and touch Python objects), so a
 * frame is written by one thread at a time, as the journal's lock already ensures.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "walkit_wire.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <nmmintrin.h>
#define WK_HW 1
#else
#define WK_HW 0
#endif

#define POLY 0x82F63B78u
#define BLOCK 2048              /* bytes per lane of the first three-lane rounds, */
#define ENTRY_TYPE 1            /* FrameType.ENTRY */
#define FLAG_FLUSH_START 0x01
#define ENTRY_HEAD 28           /* <IBBHIQq: crc, type, flags, reserved, length, ledger, entry */
#define FRAME_HEADER 12         /* <IBBHI */

#define MID 256                 /* ... of the three-lane rounds after them */
#define SHORT 64                /* ... and of the last ones */

static int have_hw;
/* x^(8*BLOCK), x^(8*MID), x^(8*SHORT) mod POLY as tables: shift_x[k][b] is the product
 * of that power and byte b at byte k of a CRC state (the product is linear in the state,
 * so a state's is the xor of its four bytes'). */
static uint32_t shift_block[4][256], shift_mid[4][256], shift_short[4][256];

/* a * b modulo POLY, both reflected (bit 31 is x^0). */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t prod = 0;

    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            prod ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;   /* b *= x */
    }
    return prod;
}

/* x^n modulo POLY, reflected. */
static uint32_t xpow(uint64_t n)
{
    uint32_t result = 1u << 31, base = 1u << 30;   /* x^0, x^1 */

    while (n) {
        if (n & 1)
            result = multmodp(result, base);
        base = multmodp(base, base);
        n >>= 1;
    }
    return result;
}

/* The table of ``shift`` (x^(8*len)): one product per value of each byte of a state. */
static void make_shift(uint32_t table[4][256], uint32_t shift)
{
    for (int k = 0; k < 4; k++)
        for (uint32_t v = 0; v < 256; v++)
            table[k][v] = multmodp(shift, v << (8 * k));
}

static inline uint32_t shift_by(const uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^ table[3][crc >> 24];
}

#if WK_HW
__attribute__((target("sse4.2")))
static uint32_t crc_lane(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;

    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    crc = (uint32_t)c;
    for (; n; p++, n--)
        crc = _mm_crc32_u8(crc, *p);
    return crc;
}

/* Bytes [p, p + 3 * block) in three lanes, each one's state joined to the next by
 * ``shift`` (x^(8*block) as a table): the CRC register after them, from ``crc``. */
__attribute__((target("sse4.2")))
static uint32_t crc_three_lanes(uint32_t crc, const unsigned char *p, size_t block, const uint32_t shift[4][256])
{
    uint64_t a = crc, b = 0, c = 0;
    const unsigned char *end = p + block;

    for (; p < end; p += 8) {
        uint64_t wa, wb, wc;
        memcpy(&wa, p, 8);
        memcpy(&wb, p + block, 8);
        memcpy(&wc, p + 2 * block, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        c = _mm_crc32_u64(c, wc);
    }
    crc = shift_by(shift, (uint32_t)a) ^ (uint32_t)b;
    return shift_by(shift, crc) ^ (uint32_t)c;
}

/* The CRC register after ``n`` bytes from state ``crc`` (no pre/post inversion): long
 * runs in lanes of BLOCK bytes, then of MID and SHORT (a 1 KiB entry: one round of
 * each), the rest in one lane. */
__attribute__((target("sse4.2")))
static uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n)
{
    for (; n >= 3 * BLOCK; p += 3 * BLOCK, n -= 3 * BLOCK)
        crc = crc_three_lanes(crc, p, BLOCK, shift_block);
    for (; n >= 3 * MID; p += 3 * MID, n -= 3 * MID)
        crc = crc_three_lanes(crc, p, MID, shift_mid);
    for (; n >= 3 * SHORT; p += 3 * SHORT, n -= 3 * SHORT)
        crc = crc_three_lanes(crc, p, SHORT, shift_short);
    return crc_lane(crc, p, n);
}
#else
static uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n)
{
    (void)p;
    (void)n;
    return crc;   /* never called: HARDWARE_CRC is 0 */
}
#endif

/* crc32c(data, seed) as the crc32c package computes it (seed: a previous CRC). */
static uint32_t crc32c(uint32_t seed, const unsigned char *p, size_t n)
{
    return ~crc_update(~seed, p, n);
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }   /* little-endian host */
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

enum { FRAMED = 0, NO_ROOM = 1, NOT_HERE = 2, FAILED = 3 };

/* Frame one entry at dst + *pos, ending at most at limit. ``strict``: only ids of type
 * int and payloads that are bytes, bytearray or memoryview (what the journal's
 * check_record takes as they are) - anything else is NOT_HERE before any of its Python
 * code (an __index__, a __len__) runs, so that a caller may frame first and check only
 * what comes back. FRAMED moves *pos; NO_ROOM
 * (*need: the frame's size) and NOT_HERE write nothing and leave no Python error set;
 * FAILED leaves the error that must not be swallowed (KeyboardInterrupt, SystemExit:
 * a signal handler that ran in an id's __index__). */
static int put_entry(unsigned char *dst, Py_ssize_t *pos, Py_ssize_t limit, uint32_t seed, int first, int strict,
                     PyObject *ledger_obj, PyObject *entry_obj, PyObject *data_obj, Py_ssize_t *need)
{
    unsigned long long ledger;
    long long entry;
    const char *data;
    Py_ssize_t len;
    Py_buffer view;
    int have_view = 0, status = NOT_HERE;

    if (strict && !(PyLong_CheckExact(ledger_obj) && PyLong_CheckExact(entry_obj) &&
                    (PyBytes_Check(data_obj) || PyByteArray_Check(data_obj) || PyMemoryView_Check(data_obj))))
        return NOT_HERE;   /* not a value check_record takes as it is: the caller checks it */
    ledger = PyLong_AsUnsignedLongLong(ledger_obj);
    if (ledger == (unsigned long long)-1 && PyErr_Occurred())
        goto out;
    entry = PyLong_AsLongLong(entry_obj);
    if (entry == -1 && PyErr_Occurred())
        goto out;
    if (PyBytes_CheckExact(data_obj)) {
        char *b;
        if (PyBytes_AsStringAndSize(data_obj, &b, &len) < 0)
            goto out;
        data = b;
    } else {
        if (PyObject_GetBuffer(data_obj, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        have_view = 1;
        /* one dimension of bytes, as the reference's slice assignment takes */
        if (view.ndim != 1 || (view.format != NULL && strcmp(view.format, "B") != 0))
            goto out;
        data = view.buf;
        len = view.len;
        if (PyObject_Length(data_obj) != len)   /* len() is what FrameBuffer sizes room by; */
            goto out;                          /* its error (if any) is judged at out */
    }
    if ((uint64_t)len > UINT32_MAX - (ENTRY_HEAD - FRAME_HEADER))
        goto out;   /* the length field is a u32: Python's struct.error */
    if (limit - *pos < ENTRY_HEAD || len > limit - *pos - ENTRY_HEAD) {   /* no overflow: pos <= limit */
        *need = ENTRY_HEAD + len;
        status = NO_ROOM;
        goto out;
    }
    {
        unsigned char *f = dst + *pos;
        put_u32(f + 0, 0);
        f[4] = ENTRY_TYPE;
        f[5] = (*pos == 0 && first) ? FLAG_FLUSH_START : 0;
        f[6] = f[7] = 0;
        put_u32(f + 8, (uint32_t)(ENTRY_HEAD - FRAME_HEADER + len));
        put_u64(f + 12, (uint64_t)ledger);
        put_u64(f + 20, (uint64_t)entry);
        memcpy(f + ENTRY_HEAD, data, (size_t)len);
        put_u32(f, crc32c(seed, f + 4, (size_t)(ENTRY_HEAD - 4 + len)));
        *pos += ENTRY_HEAD + len;
        status = FRAMED;
    }
out:
    if (have_view)
        PyBuffer_Release(&view);
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return FAILED;
        PyErr_Clear();   /* an id or payload not framed here: the Python path says why */
    }
    return status;
}

/* The destination: a writable buffer whose bytes [pos, limit) exist. */
static int get_dest(PyObject *obj, Py_buffer *dst, Py_ssize_t pos, Py_ssize_t limit)
{
    if (PyObject_GetBuffer(obj, dst, PyBUF_WRITABLE) < 0)
        return -1;
    if (pos < 0 || limit > dst->len || pos > limit) {
        PyBuffer_Release(dst);
        PyErr_Format(PyExc_ValueError, "frame window [%zd, %zd) outside a buffer of %zd bytes", pos, limit, dst->len);
        return -1;
    }
    return 0;
}

static int get_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name,
                    Py_ssize_t *pos, Py_ssize_t *limit, uint32_t *seed, int *first)
{
    unsigned long s;

    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    if (!have_hw) {   /* the CRC would be wrong, or the instruction fault */
        PyErr_SetString(PyExc_RuntimeError, "no hardware CRC32C on this CPU: frame in Python");
        return -1;
    }
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    *limit = PyLong_AsSsize_t(args[2]);
    if (*limit == -1 && PyErr_Occurred())
        return -1;
    s = PyLong_AsUnsignedLong(args[3]);
    if (s == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (s > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "seed is a u32");
        return -1;
    }
    *seed = (uint32_t)s;
    *first = PyObject_IsTrue(args[4]);
    return *first < 0 ? -1 : 0;
}

PyDoc_STRVAR(frame_entry_doc,
"frame_entry(buffer, pos, limit, seed, first, ledger_id, entry_id, data) -> int\n\n"
"Frame one ENTRY record at buffer[pos:] as FrameBuffer.append does; the frame carries\n"
"FLAG_FLUSH_START when pos is 0 and first is true. Returns the new end (> 0); minus\n"
"the frame's size when it would end past limit (nothing written); 0 when the record is\n"
"not one this module frames (the caller frames it in Python). Strict: ids must be of\n"
"type int and data bytes, bytearray or memoryview, else 0 before any of their code runs.");

static PyObject *frame_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pos, limit, need = 0;
    uint32_t seed;
    int first, status;
    Py_buffer dst;

    (void)self;
    if (get_args(args, nargs, 8, "frame_entry", &pos, &limit, &seed, &first) < 0)
        return NULL;
    if (get_dest(args[0], &dst, pos, limit) < 0)
        return NULL;
    status = put_entry(dst.buf, &pos, limit, seed, first, 1, args[5], args[6], args[7], &need);
    PyBuffer_Release(&dst);
    if (status == FAILED)
        return NULL;
    return PyLong_FromSsize_t(status == FRAMED ? pos : status == NO_ROOM ? -need : 0);
}

PyDoc_STRVAR(frame_entries_doc,
"frame_entries(buffer, pos, limit, seed, first, entries, start) -> (pos, next, status, need)\n\n"
"Frame entries[start:] - a list of (ledger id, entry id, payload) tuples - one after\n"
"another from buffer[pos:], as FrameBuffer.append_entries does. Stops at the first entry\n"
"it cannot frame: status 0 when all were framed, 1 when entries[next] would end past\n"
"limit (need: its frame's size), 2 when entries[next] is not one this module frames.\n"
"pos is where framing stopped.");

static PyObject *frame_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pos, limit, i, need = 0;
    uint32_t seed;
    int first, status = FRAMED;
    Py_buffer dst;
    PyObject *entries;

    (void)self;
    if (get_args(args, nargs, 7, "frame_entries", &pos, &limit, &seed, &first) < 0)
        return NULL;
    entries = args[5];
    if (!PyList_Check(entries)) {
        PyErr_SetString(PyExc_TypeError, "frame_entries() wants a list of entries");
        return NULL;
    }
    i = PyLong_AsSsize_t(args[6]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "frame_entries() start must be >= 0");
        return NULL;
    }
    if (get_dest(args[0], &dst, pos, limit) < 0)
        return NULL;
    for (; i < PyList_Size(entries); i++) {   /* the list's length now: an __index__ may change it */
        PyObject *item = PyList_GetItem(entries, i);

        if (item == NULL || !PyTuple_Check(item) || PyTuple_Size(item) != 3) {
            PyErr_Clear();
            status = NOT_HERE;
            break;
        }
        Py_INCREF(item);   /* an id's __index__ may run Python code that changes the list */
        status = put_entry(dst.buf, &pos, limit, seed, first, 0, PyTuple_GetItem(item, 0), PyTuple_GetItem(item, 1),
                           PyTuple_GetItem(item, 2), &need);
        Py_DECREF(item);
        if (status != FRAMED)
            break;
    }
    PyBuffer_Release(&dst);
    if (status == FAILED)
        return NULL;   /* the frames written before it are not counted: the caller's fill stays */
    return Py_BuildValue("(nnin)", pos, i, status, need);
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data, seed=0) -> int: CRC32C of a byte buffer, continuing from seed.");

static PyObject *py_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer data;
    unsigned long seed = 0;
    uint32_t crc;

    (void)self;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c(data, seed=0)");
        return NULL;
    }
    if (nargs == 2) {
        seed = PyLong_AsUnsignedLong(args[1]);
        if (seed == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (seed > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "seed is a u32");
            return NULL;
        }
    }
    if (!have_hw) {
        PyErr_SetString(PyExc_RuntimeError, "no hardware CRC32C on this CPU");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &data, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    crc = crc32c((uint32_t)seed, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"frame_entry", (PyCFunction)(void (*)(void))frame_entry, METH_FASTCALL, frame_entry_doc},
    {"frame_entries", (PyCFunction)(void (*)(void))frame_entries, METH_FASTCALL, frame_entries_doc},
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_FASTCALL, crc32c_doc},
    {"cut_adds", (PyCFunction)(void (*)(void))cut_adds, METH_FASTCALL, PyDoc_STR(CUT_ADDS_DOC)},
    {"pack_added", (PyCFunction)(void (*)(void))pack_added, METH_FASTCALL, PyDoc_STR(PACK_ADDED_DOC)},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bookie._frames",
    "Journal ENTRY frames packed in C (native/walkit_frames.c); walkit ADD_ENTRY frames cut and their answers packed "
    "(native/walkit_wire.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frames(void)
{
    PyObject *m = PyModule_Create(&module);

    if (m == NULL || wire_init() < 0) {
        Py_XDECREF(m);
        return NULL;
    }
#if WK_HW
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    make_shift(shift_block, xpow(8 * (uint64_t)BLOCK));
    make_shift(shift_mid, xpow(8 * (uint64_t)MID));
    make_shift(shift_short, xpow(8 * (uint64_t)SHORT));
    if (PyModule_AddIntConstant(m, "HARDWARE_CRC", have_hw) < 0 || PyModule_AddIntConstant(m, "ENTRY_HEAD", ENTRY_HEAD) < 0 ||
        PyModule_AddIntConstant(m, "ENTRY_TYPE", ENTRY_TYPE) < 0 ||
        PyModule_AddIntConstant(m, "FLAG_FLUSH_START", FLAG_FLUSH_START) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
