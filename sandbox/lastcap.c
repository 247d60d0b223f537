//go:build linux && cgo

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The one piece early.c (trialnet-exec) and init_early.c (the Trial's
// init, a binary of its own on x86-64) share.

#include <string.h>

#include "early.h"

int trialnet_parse_last_cap(const char *buf) {
	int last = 0;
	const char *c = buf;
	for (; *c >= '0' && *c <= '9' && c - buf < 3; c++)
		last = last * 10 + (*c - '0');
	// The number, and nothing but its newline after it; a capability
	// set has 64 bits.
	if (c == buf || (*c && strcmp(c, "\n")) || last > 63)
		return -1;
	return last;
}
