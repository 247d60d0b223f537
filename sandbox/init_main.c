//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The Trial's init as a static binary of its own (x86-64): init_early.c's
// set-up and reaper, chosen by argv[0] as early.c's constructor chooses
// them in the trialnet binary elsewhere. `make generate` builds it into
// init_amd64.elf, which initimage_amd64.go embeds.

#include <string.h>
#include <unistd.h>

#include "early.h"

int main(int argc, char **argv) {
	if (argc >= 1 && !strcmp(argv[0], "trialnet-init-setup"))
		trialnet_init_setup(argc, argv);
	if (argc == 1 && !strcmp(argv[0], "trialnet-init"))
		trialnet_init_reap();
	static const char msg[] = "trialnet-init: run as neither trialnet-init-setup nor trialnet-init: only a trialnet launcher starts this\n";
	(void)!write(2, msg, sizeof msg - 1);
	return 2;
}
