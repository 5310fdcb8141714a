/*
 * ckpy_convert.c - ckptio.convert: ckptio_convert() with the GIL released.
 *
 * The notes (what OUT will not hold) are collected while the library runs
 * without the GIL and handed back with the result, or attached to nothing
 * when the conversion fails (its error says what went wrong).
 */
#include "ckpy_engine.h"
#include "ckpy_parts.h"

#include <string.h>

typedef struct convert_call {
    const char *in, *out;
    ckptio_convert_options options;
    ckptio_convert_report report;
    char notes[8192]; /* lines separated by '\n' */
    size_t used;
} convert_call;

static void collect_note(const char *note, void *user) {
    convert_call *c = user;
    const size_t n = strlen(note);
    if (c->used + n + 2 > sizeof c->notes) return; /* the first notes are the ones that matter */
    memcpy(c->notes + c->used, note, n);
    c->used += n;
    c->notes[c->used++] = '\n';
    c->notes[c->used] = '\0';
}

static ckptio_status do_convert(ckptio_engine *engine, void *arg) {
    convert_call *c = arg;
    return ckptio_convert(engine, c->in, c->out, &c->options, &c->report);
}

static const char *const to_names[] = {"auto", "safetensors", "hf", "torch", "dcp"};
static const char *const from_names[] = {"unknown", "safetensors", "torch", "torch", "dcp", "hf", "directory"};

static PyObject *mod_convert(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"src", "dst", "to", "shard_size", "alignment", "engine", NULL};
    PyObject *src_arg, *dst_arg, *engine_arg = Py_None;
    const char *to = "auto";
    unsigned long long shard_size = 0;
    unsigned int alignment = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|sKIO:convert", kwlist, &src_arg, &dst_arg, &to, &shard_size,
                                     &alignment, &engine_arg))
        return NULL;
    convert_call *c = PyMem_Calloc(1, sizeof *c);
    if (!c) return PyErr_NoMemory();
    int kind = -1;
    for (int k = 0; k < 5; k++)
        if (strcmp(to, to_names[k]) == 0) kind = k;
    PyObject *src = NULL, *dst = NULL, *result = NULL;
    ckpy_engine *engine = NULL;
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "to must be 'safetensors', 'hf', 'torch', 'dcp' or None, not '%s'", to);
        goto out;
    }
    if (!(src = ckpy_path_bytes(src_arg)) || !(dst = ckpy_path_bytes(dst_arg))) goto out;
    c->in = PyBytes_AsString(src);
    c->out = PyBytes_AsString(dst);
    c->options = (ckptio_convert_options){.to = (ckptio_convert_to)kind, .shard_size = shard_size,
                                          .storage_alignment = alignment, .note = collect_note, .user = c};
    if (!(engine = ckpy_engine_resolve(engine_arg)) || ckpy_engine_run(engine, do_convert, c) != 0) goto out;
    const ckptio_convert_report *r = &c->report;
    result = Py_BuildValue("{s:s,s:s,s:n,s:K,s:n,s:n,s:n,s:n,s:s#}", "from",
                           from_names[(unsigned)r->from < 7 ? r->from : 0], "to", to_names[r->to], "tensors",
                           (Py_ssize_t)r->tensors, "bytes", (unsigned long long)r->bytes, "files", (Py_ssize_t)r->files,
                           "byte_items", (Py_ssize_t)r->byte_items, "dropped", (Py_ssize_t)r->dropped, "shared",
                           (Py_ssize_t)r->shared, "notes", c->notes, (Py_ssize_t)c->used);
out:
    Py_XDECREF(engine);
    Py_XDECREF(src);
    Py_XDECREF(dst);
    PyMem_Free(c);
    return result;
}

static PyMethodDef convert_methods[] = {
    {"convert", (PyCFunction)(void (*)(void))mod_convert, METH_VARARGS | METH_KEYWORDS,
     "convert(src, dst, to='auto', shard_size=0, alignment=0, engine=None) -> {from, to, tensors, bytes, files,\n"
     "byte_items, dropped, shared, notes}: ckptio_convert (any of safetensors / Hugging Face / torch.save / DCP\n"
     "into any); notes: the lines saying what dst does not hold. GIL released."},
    {NULL, NULL, 0, NULL},
};

int ckpy_convert_add_to_module(PyObject *module) { return PyModule_AddFunctions(module, convert_methods); }
