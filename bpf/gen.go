// Package bpf holds trialnet's eBPF programs and the Go code that loads,
// attaches, pins and reads them.
package bpf

//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type trial_policy -type trial_counters -type unix_key -type unix_id_key -type trial_ptys -type trial_flag trialnet trialnet.bpf.c -- -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel steer steer.bpf.c -- -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel netnsscan netnsscan.bpf.c -- -I/usr/include/x86_64-linux-gnu
