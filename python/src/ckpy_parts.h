/*
 * ckpy_parts.h - the parts of the module, one per area: each adds its
 * functions, types and constants to the module (PyInit__ckptio in
 * ckpy_module.c calls them all). Each part includes this header for its own
 * prototype only; ckpy_module.c is the one file that calls them.
 */
#ifndef CKPY_PARTS_H
#define CKPY_PARTS_H

#include "ckpy_internal.h"

int ckpy_safetensors_add_to_module(PyObject *module); /* ckpy_safetensors.c */
int ckpy_file_add_to_module(PyObject *module);        /* ckpy_file.c */
int ckpy_gds_add_to_module(PyObject *module);         /* ckpy_gds.c: GDS file API, CUDA queries */
int ckpy_torch_add_to_module(PyObject *module);       /* ckpy_torch.c */
int ckpy_pickle_add_to_module(PyObject *module);      /* ckpy_pickle.c */
int ckpy_model_add_to_module(PyObject *module);       /* ckpy_model.c */
int ckpy_dcp_add_to_module(PyObject *module);         /* ckpy_dcp.c: torch.distributed.checkpoint items */
int ckpy_dcp_commit_add_to_module(PyObject *module);  /* ckpy_dcp_commit.c: the DCP directory commit */
int ckpy_steps_add_to_module(PyObject *module);       /* ckpy_steps.c: the checkpoint manager's steps */
int ckpy_convert_add_to_module(PyObject *module);     /* ckpy_convert.c: any checkpoint into any format */
int ckpy_snapshot_add_to_module(PyObject *module);    /* ckpy_snapshot.c: snapshot pools */
int ckpy_object_add_to_module(PyObject *module);      /* ckpy_object.c: objects in S3-compatible storage */
int ckpy_mapping_add_to_module(PyObject *module);     /* ckpy_mapping.c: files mapped into memory */

/* Module-level functions of the parts, listed in ckpy_module.c's table. */
PyObject *ckpy_safetensors_save(PyObject *self, PyObject *args, PyObject *kwargs); /* ckpy_safetensors.c */
PyObject *ckpy_model_save(PyObject *self, PyObject *args, PyObject *kwargs);       /* ckpy_safetensors.c */
PyObject *ckpy_torch_save(PyObject *self, PyObject *args, PyObject *kwargs);       /* ckpy_torch_save.c */

#endif /* CKPY_PARTS_H */
