/*
 * vm_flags.h - what /proc/self/smaps says of a mapping's VmFlags (test-only).
 * In the doubles library so that the simulated GPU (whether a slot it is
 * asked to pin is advised huge) and the tests (t_vm_flag) read it one way.
 */
#ifndef CKPTIO_VM_FLAGS_H
#define CKPTIO_VM_FLAGS_H

/* Whether the mapping holding p carries VmFlag `flag` ("dc", "hg", ...):
 * 1 yes, 0 no, -1 no such mapping or no smaps. */
int ckptio__test_vm_flag(const void *p, const char *flag);

#endif /* CKPTIO_VM_FLAGS_H */
