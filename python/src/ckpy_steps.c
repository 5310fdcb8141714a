/*
 * ckpy_steps.c - the checkpoint manager's steps (include/ckptio/steps.h
 * "Checkpoint manager") for ckptio.CheckpointManager and `ckptio`'s
 * Python face: scan, check, latest, begin, commit, remove, clean, retain,
 * pin.
 * Thin: arguments in, the C call with the GIL released (through the
 * engine's lock where an engine is used), results out.
 */
#include "ckpy_engine.h"
#include "ckpy_parts.h"

#include <string.h>

static const char *state_name(ckptio_step_state s) {
    return s == CKPTIO_STEP_COMPLETE  ? "complete"
           : s == CKPTIO_STEP_PARTIAL ? "partial"
           : s == CKPTIO_STEP_FOREIGN ? "foreign"
           : s == CKPTIO_STEP_REFUSED ? "refused"
                                      : "damaged";
}

/* (step, state, bytes, files, reason, status): status is the failed check's (damaged, refused), else 0 */
static PyObject *info_tuple(const ckptio_step_info *i) {
    return Py_BuildValue("(KsKnsi)", (unsigned long long)i->step, state_name(i->state), (unsigned long long)i->bytes,
                         (Py_ssize_t)i->files, i->reason, (int)i->status);
}

static PyObject *info_list(const ckptio_step_info *v, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = info_tuple(&v[i]);
        if (!t) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, t);
    }
    return list;
}

static PyObject *step_list(const uint64_t *v, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (!x) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, x);
    }
    return list;
}

static int check_arg(const char *s, ckptio_step_check *out) {
    if (!strcmp(s, "marker")) *out = CKPTIO_STEP_CHECK_MARKER;
    else if (!strcmp(s, "fast")) *out = CKPTIO_STEP_CHECK_FAST;
    else if (!strcmp(s, "full")) *out = CKPTIO_STEP_CHECK_FULL;
    else {
        PyErr_Format(PyExc_ValueError, "check must be 'full', 'fast' or 'marker', not '%s'", s);
        return -1;
    }
    return 0;
}

/* ---- calls that take the engine ------------------------------------------------------ */

typedef struct steps_call {
    const char *root;
    uint64_t step, keep_last, keep_every;
    ckptio_step_check check;
    ckptio_step_info info;
    ckptio_step_info *skipped;
    size_t nskipped;
    uint64_t *removed;
    size_t nremoved;
    int found;
} steps_call;

static ckptio_status do_check(ckptio_engine *e, void *arg) {
    steps_call *c = arg;
    return ckptio_steps_check(e, c->root, c->step, c->check, &c->info);
}

static ckptio_status do_latest(ckptio_engine *e, void *arg) {
    steps_call *c = arg;
    const ckptio_status st = ckptio_steps_latest(e, c->root, c->check, &c->step, &c->skipped, &c->nskipped);
    c->found = st == CKPTIO_OK;
    return st == CKPTIO_E_NOT_FOUND ? CKPTIO_OK : st;
}

static ckptio_status do_retain(ckptio_engine *e, void *arg) {
    steps_call *c = arg;
    return ckptio_steps_retain(e, c->root, c->keep_last, c->keep_every, &c->removed, &c->nremoved);
}

/* Runs fn with ROOT (a path-like) and the engine argument resolved. */
static int run_with_engine(PyObject *root_o, PyObject *engine_o, ckpy_engine_op fn, steps_call *c) {
    PyObject *root = ckpy_path_bytes(root_o);
    if (!root) return -1;
    ckpy_engine *engine = ckpy_engine_resolve(engine_o);
    c->root = PyBytes_AsString(root);
    const int rc = engine ? ckpy_engine_run(engine, fn, c) : -1;
    Py_XDECREF(engine);
    Py_DECREF(root);
    return rc;
}

static PyObject *mod_steps_check(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"root", "step", "check", "engine", NULL};
    PyObject *root_o, *engine_o = Py_None;
    const char *check = "full";
    steps_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OK|sO:steps_check", kwlist, &root_o, &c.step, &check, &engine_o) ||
        check_arg(check, &c.check) < 0 || run_with_engine(root_o, engine_o, do_check, &c) < 0)
        return NULL;
    return info_tuple(&c.info);
}

static PyObject *mod_steps_latest(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"root", "check", "engine", NULL};
    PyObject *root_o, *engine_o = Py_None;
    const char *check = "full";
    steps_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|sO:steps_latest", kwlist, &root_o, &check, &engine_o) ||
        check_arg(check, &c.check) < 0)
        return NULL;
    const int rc = run_with_engine(root_o, engine_o, do_latest, &c);
    PyObject *result = NULL;
    if (rc == 0) {
        PyObject *skipped = info_list(c.skipped, c.nskipped);
        if (skipped) {
            if (c.found) result = Py_BuildValue("(KN)", (unsigned long long)c.step, skipped);
            else result = Py_BuildValue("(ON)", Py_None, skipped);
        }
    }
    ckptio_steps_free(c.skipped);
    return result;
}

static PyObject *mod_steps_retain(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"root", "keep_last", "keep_every", "engine", NULL};
    PyObject *root_o, *engine_o = Py_None;
    steps_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKK|O:steps_retain", kwlist, &root_o, &c.keep_last,
                                     &c.keep_every, &engine_o))
        return NULL;
    const int rc = run_with_engine(root_o, engine_o, do_retain, &c);
    PyObject *result = rc == 0 ? step_list(c.removed, c.nremoved) : NULL;
    ckptio_steps_list_free(c.removed);
    return result;
}

/* ---- calls without an engine ---------------------------------------------------------- */

/* steps_scan(root) and steps_clean(root): a root in, a list out. */
static PyObject *root_list(PyObject *root_o, int clean) {
    PyObject *root = ckpy_path_bytes(root_o);
    if (!root) return NULL;
    const char *r = PyBytes_AsString(root);
    ckptio_step_info *steps = NULL;
    uint64_t *removed = NULL;
    size_t n = 0;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = clean ? ckptio_steps_clean(r, &removed, &n) : ckptio_steps_scan(r, &steps, &n);
    Py_END_ALLOW_THREADS
    Py_DECREF(root);
    PyObject *list = st != CKPTIO_OK ? ckpy_raise(st) : clean ? step_list(removed, n) : info_list(steps, n);
    ckptio_steps_free(steps);
    ckptio_steps_list_free(removed);
    return list;
}

static PyObject *mod_steps_scan(PyObject *module, PyObject *root_o) { return root_list(root_o, 0); }
static PyObject *mod_steps_clean(PyObject *module, PyObject *root_o) { return root_list(root_o, 1); }

/* (root, step): the calls that change one step. */
static PyObject *one_step(PyObject *args, const char *format, int which) {
    PyObject *root_o;
    unsigned long long step;
    if (!PyArg_ParseTuple(args, format, &root_o, &step)) return NULL;
    PyObject *root = ckpy_path_bytes(root_o);
    if (!root) return NULL;
    const char *r = PyBytes_AsString(root);
    char dir[4096] = "";
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = which == 0 ? ckptio_steps_begin(r, step, dir, sizeof dir)
         : which == 1 ? ckptio_steps_commit(r, step)
                      : ckptio_steps_remove(r, step);
    Py_END_ALLOW_THREADS
    Py_DECREF(root);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    if (which == 0) return PyUnicode_DecodeFSDefault(dir);
    Py_RETURN_NONE;
}

static PyObject *mod_steps_begin(PyObject *m, PyObject *args) { return one_step(args, "OK:steps_begin", 0); }
static PyObject *mod_steps_commit(PyObject *m, PyObject *args) { return one_step(args, "OK:steps_commit", 1); }
static PyObject *mod_steps_remove(PyObject *m, PyObject *args) { return one_step(args, "OK:steps_remove", 2); }

/* ---- pins ------------------------------------------------------------------------------ */

#define PIN_CAPSULE "ckptio.step_pin"

/* The capsule holds a box so that unpin can empty it (a capsule's pointer
 * cannot be NULL); the destructor unpins what is still pinned. */
typedef struct pin_box {
    ckptio_step_pin *pin;
} pin_box;

static void pin_capsule_free(PyObject *capsule) {
    pin_box *box = PyCapsule_GetPointer(capsule, PIN_CAPSULE);
    if (!box) {
        PyErr_Clear();
        return;
    }
    ckptio_steps_unpin(box->pin);
    PyMem_Free(box);
}

static PyObject *mod_steps_pin(PyObject *m, PyObject *args) {
    PyObject *root_o;
    unsigned long long step;
    if (!PyArg_ParseTuple(args, "OK:steps_pin", &root_o, &step)) return NULL;
    PyObject *root = ckpy_path_bytes(root_o);
    if (!root) return NULL;
    ckptio_step_pin *pin = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_steps_pin(PyBytes_AsString(root), step, &pin);
    Py_END_ALLOW_THREADS
    Py_DECREF(root);
    if (st == CKPTIO_E_NOT_FOUND) Py_RETURN_NONE;
    if (st != CKPTIO_OK) return ckpy_raise(st);
    pin_box *box = PyMem_Malloc(sizeof *box);
    if (!box) {
        ckptio_steps_unpin(pin);
        return PyErr_NoMemory();
    }
    box->pin = pin;
    PyObject *capsule = PyCapsule_New(box, PIN_CAPSULE, pin_capsule_free);
    if (!capsule) {
        ckptio_steps_unpin(pin);
        PyMem_Free(box);
    }
    return capsule;
}

static PyObject *mod_steps_unpin(PyObject *m, PyObject *capsule) {
    pin_box *box = PyCapsule_GetPointer(capsule, PIN_CAPSULE);
    if (!box) return NULL;
    ckptio_step_pin *pin = box->pin;
    box->pin = NULL;
    ckptio_steps_unpin(pin);
    Py_RETURN_NONE;
}

static PyObject *mod_steps_dir_name(PyObject *m, PyObject *arg) {
    const unsigned long long step = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    char name[32];
    const ckptio_status st = ckptio_steps_dir_name(step, name, sizeof name);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return PyUnicode_FromString(name);
}

static PyMethodDef steps_methods[] = {
    {"steps_dir_name", mod_steps_dir_name, METH_O, "steps_dir_name(step) -> 'step_NNNNNNNN' (ckptio_steps_dir_name)."},
    {"steps_scan", mod_steps_scan, METH_O,
     "steps_scan(root) -> [(step, state, bytes, files, reason)], ascending, states from the markers\n"
     "(ckptio_steps_scan). GIL released."},
    {"steps_check", (PyCFunction)(void (*)(void))mod_steps_check, METH_VARARGS | METH_KEYWORDS,
     "steps_check(root, step, check='full', engine=None) -> (step, state, bytes, files, reason)\n"
     "(ckptio_steps_check; check 'marker', 'fast' or 'full')."},
    {"steps_latest", (PyCFunction)(void (*)(void))mod_steps_latest, METH_VARARGS | METH_KEYWORDS,
     "steps_latest(root, check='full', engine=None) -> (step or None, [skipped (step, state, bytes, files,\n"
     "reason)], newest first) (ckptio_steps_latest)."},
    {"steps_begin", mod_steps_begin, METH_VARARGS,
     "steps_begin(root, step) -> step directory: partial steps removed, the directory created with its\n"
     "begun mark (ckptio_steps_begin; hold the root's lock)."},
    {"steps_commit", mod_steps_commit, METH_VARARGS,
     "steps_commit(root, step): the step's marker (ckptio_steps_commit)."},
    {"steps_remove", mod_steps_remove, METH_VARARGS, "steps_remove(root, step) (ckptio_steps_remove)."},
    {"steps_clean", mod_steps_clean, METH_O, "steps_clean(root) -> [removed steps] (ckptio_steps_clean)."},
    {"steps_retain", (PyCFunction)(void (*)(void))mod_steps_retain, METH_VARARGS | METH_KEYWORDS,
     "steps_retain(root, keep_last, keep_every, engine=None) -> [removed steps] (ckptio_steps_retain)."},
    {"steps_pin", mod_steps_pin, METH_VARARGS,
     "steps_pin(root, step) -> pin, or None when the step has no marker now or a removal holds it\n"
     "(ckptio_steps_pin): retention leaves a pinned step for later."},
    {"steps_unpin", mod_steps_unpin, METH_O, "steps_unpin(pin): releases it; a second call does nothing."},
    {NULL, NULL, 0, NULL},
};

int ckpy_steps_add_to_module(PyObject *module) {
    if (PyModule_AddFunctions(module, steps_methods) < 0) return -1;
    if (PyModule_AddStringConstant(module, "STEP_BEGUN", CKPTIO_STEP_BEGUN) < 0) return -1;
    return PyModule_AddStringConstant(module, "STEP_MARKER", CKPTIO_STEP_MARKER);
}
