/* walkit_wire.h - walkit_wire.c's calls, registered by walkit_frames.c's module (bookie._frames). */
#ifndef WALKIT_WIRE_H
#define WALKIT_WIRE_H

#include <Python.h>

#define CUT_ADDS_DOC \
    "cut_adds(src, off, limit, AddEntry, events) -> int\n--\n\n" \
    "Cut the ADD_ENTRY frames of ServerConnection.receive's hot path from src[off:], one after\n" \
    "another, appending an AddEntry for each to events; stops at the first frame that is not\n" \
    "one (or not whole, or whose length is not 12..limit) and returns its offset."
#define PACK_ADDED_DOC \
    "pack_added(reqs, version) -> bytes | None\n--\n\n" \
    "The answer frames of the durable adds reqs, back to back (send_added_many's bytes); None\n" \
    "when a request's ids are not ints of the wire's ranges (the caller packs in Python)."

int wire_init(void);
PyObject *cut_adds(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pack_added(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
