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
    if (ckptio_dcp_manifest(dcp, &name) != CKPTIO_OK) return ckptio_dcp_check(dcp, report);
    if (manifest) *manifest = name;
    return ckptio_dcp_verify(dcp, report);
}
