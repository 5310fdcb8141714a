/*
 * dcp_validate.c - the one rule `ckptio verify DIR` and ckptio.dcp.verify
 * apply to a DCP directory: every item against the ckptio manifest's
 * XXH3-64 when the directory has one (ckptio_dcp_verify), else the
 * structural check (ckptio_dcp_check), and the caller is told which ran.
 *
 * A directory torch wrote has no manifest, and that is not damage: both
 * faces report it ("no manifest: bytes not checked against checksums")
 * instead of failing, so the same directory gets the same answer from the
 * command line and from Python.
 */
#include "common_internal.h"

ckptio_status ckptio_dcp_validate(ckptio_dcp *dcp, ckptio_dcp_verify_report *report, const char **manifest) {
    CKPTIO_RETURN_IF(!dcp, CKPTIO_E_INVAL, "ckptio_dcp_validate: the handle is required");
    const char *name = NULL;
    if (manifest) *manifest = NULL;
    /* Only a manifest that is not there means "saved without checksums"; one
     * that is there but cannot be read (a FIFO, a directory) is damage. */
    const ckptio_status has = ckptio_dcp_manifest(dcp, &name);
    if (has == CKPTIO_E_NOT_FOUND) return ckptio_dcp_check(dcp, report);
    if (has != CKPTIO_OK) return has;
    if (manifest) *manifest = name;
    return ckptio_dcp_verify(dcp, report);
}
