/*
 * walkit_wire.c - part of bookie._frames: a run of walkit ADD_ENTRY frames cut into
 * AddEntry messages, and the frames answering durable adds packed, in C.
 *
 * Theory of operation
 * -------------------
 * A pipelined writer's chunk of a few hundred adds costs the bookie a turn of
 * ServerConnection.receive's Python loop per add (a struct unpack, six tests, two
 * slices, a new AddEntry and its six fields: ~0.7 us) and a struct pack per answer.
 * cut_adds does receive's hot path for as many consecutive frames as take it, and
 * pack_added does send_added_many's join, one call per chunk.
 *
 * The Python code (walkit/protocol/_connection.py) stays the reference and these calls
 * take exactly its shape and nothing else: cut_adds takes a frame only where the
 * reference's hot path would (a whole frame, its length prefix in range, kind 1,
 * version 1, flags 0 or 1, a key of at most 64 bytes inside the frame, ledger and entry
 * ids below 2^63) and builds the same message (the same field values, set in the same
 * order, without running the constructor's checks: the frame's layout fixed the types,
 * the tests above the ranges). It stops at the first frame it does not take - any other
 * request, a malformed add, an incomplete frame, a bad length - and the reference's loop
 * handles that one. pack_added answers None (nothing packed) when a message's fields are
 * not ints in the wire's ranges, and the caller packs in Python, which raises what it
 * always raised. The GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "walkit_wire.h"

#define LENGTH_SIZE 4
#define HEADER_SIZE 12          /* version, kind, flags, request id: after the length */
#define ADD_HEAD 29             /* >BBHQQQB: the header, ledger, entry, key length */
#define ADD_KIND 1              /* Op.ADD_ENTRY's kind byte */
#define ADDED_KIND 0x81         /* its answer's */
#define MAX_KEY 64
#define ANSWER 32               /* >IBBHQQQ: length 28, version, kind, status, ids */
#define I63 0x7FFFFFFFFFFFFFFFull

static PyObject *name_ledger, *name_entry, *name_key, *name_data, *name_recovery, *name_request;

int wire_init(void)
{
    name_ledger = PyUnicode_InternFromString("ledger_id");
    name_entry = PyUnicode_InternFromString("entry_id");
    name_key = PyUnicode_InternFromString("master_key");
    name_data = PyUnicode_InternFromString("data");
    name_recovery = PyUnicode_InternFromString("recovery");
    name_request = PyUnicode_InternFromString("request_id");
    return (name_ledger && name_entry && name_key && name_data && name_recovery && name_request) ? 0 : -1;
}

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

/* Set one field (a new reference, stolen; NULL: the error of making it). */
static int set_field(PyObject *obj, PyObject *name, PyObject *value)
{
    int rc;

    if (value == NULL)
        return -1;
    rc = PyObject_GenericSetAttr(obj, name, value);
    Py_DECREF(value);
    return rc;
}

/* The AddEntry of one frame whose fields were checked; NULL with an exception set. */
static PyObject *new_add(PyObject *type, newfunc tp_new, PyObject *no_args, const char *p, Py_ssize_t key_at,
                         Py_ssize_t key_end, Py_ssize_t end, uint64_t ledger, uint64_t entry, int recovery,
                         uint64_t rid)
{
    PyObject *obj = tp_new((PyTypeObject *)type, no_args, NULL);

    if (obj == NULL)
        return NULL;
    if (set_field(obj, name_ledger, PyLong_FromUnsignedLongLong(ledger)) < 0 ||
        set_field(obj, name_entry, PyLong_FromUnsignedLongLong(entry)) < 0 ||
        set_field(obj, name_key, PyBytes_FromStringAndSize(p + key_at, key_end - key_at)) < 0 ||
        set_field(obj, name_data, PyBytes_FromStringAndSize(p + key_end, end - key_end)) < 0 ||
        set_field(obj, name_recovery, PyBool_FromLong(recovery)) < 0 ||
        set_field(obj, name_request, PyLong_FromUnsignedLongLong(rid)) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

PyObject *cut_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const unsigned char *p;
    char *raw;
    Py_ssize_t n, off, limit;
    PyObject *type, *events, *no_args;
    newfunc tp_new;

    (void)self;
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyType_Check(args[3]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "cut_adds(src: bytes, off, limit, AddEntry, events: list)");
        return NULL;
    }
    off = PyLong_AsSsize_t(args[1]);
    limit = PyLong_AsSsize_t(args[2]);
    if ((off == -1 || limit == -1) && PyErr_Occurred())
        return NULL;
    if (PyBytes_AsStringAndSize(args[0], &raw, &n) < 0)
        return NULL;
    if (off < 0 || off > n) {
        PyErr_SetString(PyExc_ValueError, "cut_adds() off out of range");
        return NULL;
    }
    type = args[3];
    events = args[4];
    tp_new = (newfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_new);
    if (tp_new == NULL) {
        PyErr_SetString(PyExc_TypeError, "cut_adds() wants a type it can make");
        return NULL;
    }
    no_args = PyTuple_New(0);
    if (no_args == NULL)
        return NULL;
    p = (const unsigned char *)raw;
    while (n - off >= LENGTH_SIZE + ADD_HEAD) {
        const unsigned char *h = p + off + LENGTH_SIZE;
        Py_ssize_t length = ((Py_ssize_t)p[off] << 24) | (p[off + 1] << 16) | (p[off + 2] << 8) | p[off + 3];
        Py_ssize_t end = off + LENGTH_SIZE + length, key_at = off + LENGTH_SIZE + ADD_HEAD, key_end;
        unsigned flags = ((unsigned)h[2] << 8) | h[3];
        uint64_t ledger = be64(h + 12), entry = be64(h + 20);
        PyObject *req;
        int rc;

        if (length < ADD_HEAD || length > limit || end > n || h[1] != ADD_KIND || h[0] != 1 || flags > 1 ||
            h[28] > MAX_KEY || ledger > I63 || entry > I63)
            break;   /* not the hot path's shape: the reference's loop takes this frame */
        key_end = key_at + h[28];
        if (key_end > end)
            break;
        req = new_add(type, tp_new, no_args, raw, key_at, key_end, end, ledger, entry, flags == 1, be64(h + 4));
        if (req == NULL) {
            Py_DECREF(no_args);
            return NULL;
        }
        rc = PyList_Append(events, req);
        Py_DECREF(req);
        if (rc < 0) {
            Py_DECREF(no_args);
            return NULL;
        }
        off = end;
    }
    Py_DECREF(no_args);
    return PyLong_FromSsize_t(off);
}

/* One int field of the wire's range (a u64) into *out: 1, 0 when it is not one (no error left set), -1 on an error
 * that is not an Exception (it propagates). */
static int int_field(PyObject *obj, PyObject *name, uint64_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    unsigned long long x;

    if (v == NULL)
        goto not_one;
    if (!PyLong_Check(v)) {
        Py_DECREF(v);
        return 0;
    }
    x = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        goto not_one;
    *out = x;
    return 1;
not_one:
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_Clear();
    return 0;
}

PyObject *pack_added(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *reqs, *out;
    Py_ssize_t n;
    unsigned char *q;
    unsigned long version;

    (void)self;
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pack_added(reqs: list, version)");
        return NULL;
    }
    reqs = args[0];
    version = PyLong_AsUnsignedLong(args[1]);
    if (version == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (version > 255) {
        PyErr_SetString(PyExc_ValueError, "pack_added() version is a byte");
        return NULL;
    }
    n = PyList_Size(reqs);
    out = PyBytes_FromStringAndSize(NULL, n * ANSWER);
    if (out == NULL)
        return NULL;
    q = (unsigned char *)PyBytes_AsString(out);
    for (Py_ssize_t i = 0; i < n; i++, q += ANSWER) {
        PyObject *req = PyList_GetItem(reqs, i);
        uint64_t rid = 0, ledger = 0, entry = 0;
        int ok;

        if (req == NULL || PyList_Size(reqs) != n) {   /* a field's lookup ran code that changed the list */
            PyErr_Clear();
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        Py_INCREF(req);
        ok = int_field(req, name_request, &rid);
        if (ok == 1)
            ok = int_field(req, name_ledger, &ledger);
        if (ok == 1)
            ok = int_field(req, name_entry, &entry);
        Py_DECREF(req);
        if (ok != 1) {
            Py_DECREF(out);
            if (ok < 0)
                return NULL;
            Py_RETURN_NONE;   /* the caller packs in Python: the reference's outcome */
        }
        q[0] = 0, q[1] = 0, q[2] = 0, q[3] = ANSWER - LENGTH_SIZE;
        q[4] = (unsigned char)version, q[5] = ADDED_KIND, q[6] = 0, q[7] = 0;
        put64(q + 8, rid);
        put64(q + 16, ledger);
        put64(q + 24, entry);
    }
    return out;
}
