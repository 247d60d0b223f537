#include "textflag.h"

// func keyctlI386GetUserKeyring() int64
// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0) through the
// i386 entry (int $0x80, i386's number 288): no pointer, so none has to
// fit in 32 bits.
TEXT ·keyctlI386GetUserKeyring(SB), NOSPLIT, $0-8
	MOVL	$288, AX
	MOVL	$0, BX
	MOVL	$-4, CX
	MOVL	$0, DX
	INT	$0x80
	MOVLQSX	AX, AX
	MOVQ	AX, ret+0(FP)
	RET
