//go:build linux && cgo

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// trialnet_mount_covered, which init_early.c's walks of the mount table
// share (a binary of its own on x86-64), and which the Go side holds to
// its mountCovered (TestMountCovered).

#include <stddef.h>
#include <string.h>

#include "early.h"

// The chain of mounts below one that trialnet_mount_covered follows; a
// deeper one is judged on this many (not covered: the init refuses).
#define CHAIN_MAX 64

struct mount_ref {
	unsigned long long id, parent;
	const char *point; // as the table prints it, len bytes
	size_t len;
};

// number reads the decimal at *s up to a space into *n.
static int number(const char **s, const char *end, unsigned long long *n) {
	const char *c = *s;
	*n = 0;
	for (; c < end && *c >= '0' && *c <= '9'; c++)
		*n = *n * 10 + (unsigned long long)(*c - '0');
	if (c == *s || c == end || *c != ' ')
		return 0;
	*s = c + 1;
	return 1;
}

// parse_ref reads the line l (end its end): ID PARENT MAJOR:MINOR ROOT POINT ...
static int parse_ref(const char *l, const char *end, struct mount_ref *r) {
	if (!number(&l, end, &r->id) || !number(&l, end, &r->parent))
		return 0;
	for (int skip = 0; skip < 2; skip++) {
		const char *sp = memchr(l, ' ', end - l);
		if (!sp)
			return 0;
		l = sp + 1;
	}
	const char *sp = memchr(l, ' ', end - l);
	r->point = l;
	r->len = (sp ? sp : end) - l;
	return r->len > 0;
}

// find looks id up in table.
static int find(const char *table, unsigned long long id, struct mount_ref *r) {
	for (const char *l = table; *l;) {
		const char *end = strchr(l, '\n');
		if (!end)
			end = l + strlen(l);
		if (parse_ref(l, end, r) && r->id == id)
			return 1;
		l = *end ? end + 1 : end;
	}
	return 0;
}

// at_or_above says whether the point a is b or beneath it. Escaped as
// the table prints them, the two compare as the paths do: no escape
// holds a '/'.
static int at_or_above(const struct mount_ref *b, const struct mount_ref *a) {
	if (b->len == 1 && b->point[0] == '/')
		return 1;
	return a->len >= b->len && !memcmp(a->point, b->point, b->len) && (a->len == b->len || a->point[b->len] == '/');
}

int trialnet_mount_covered(const char *table, unsigned long long id, const char **point, size_t *len) {
	struct mount_ref chain[CHAIN_MAX];
	int n = 0;
	if (!find(table, id, &chain[0]))
		return -1;
	*point = chain[0].point;
	*len = chain[0].len;
	for (n = 1; n < CHAIN_MAX && chain[n - 1].parent != chain[n - 1].id && find(table, chain[n - 1].parent, &chain[n]); n++)
		;
	for (const char *l = table; *l;) {
		const char *end = strchr(l, '\n');
		if (!end)
			end = l + strlen(l);
		struct mount_ref c;
		int in_chain = 0;
		if (parse_ref(l, end, &c)) {
			for (int k = 0; k < n; k++)
				in_chain |= chain[k].id == c.id;
			// A mount on one of the chain's, at the point of the next
			// one up the chain (or of id itself) or above it, hides it.
			for (int k = 0; !in_chain && k < n; k++)
				if (c.parent == chain[k].id && at_or_above(&c, &chain[k ? k - 1 : 0]))
					return 1;
		}
		l = *end ? end + 1 : end;
	}
	return 0;
}
