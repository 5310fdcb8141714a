/*
 * fuzz_check.h - what every fuzz target shares: the libFuzzer entry point's
 * declaration and CHECK, which traps (a crash the fuzzer reports with its
 * input) when an invariant of an accepted input is broken.
 */
#ifndef CKPTIO_FUZZ_CHECK_H
#define CKPTIO_FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                    \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

#endif /* CKPTIO_FUZZ_CHECK_H */
