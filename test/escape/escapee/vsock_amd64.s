#include "textflag.h"

// func socketcallI386(call uint32, args uint32) int64
// socketcall(call, args) through the i386 entry (int $0x80, i386's
// number 102).
TEXT ·socketcallI386(SB), NOSPLIT, $0-16
	MOVL	$102, AX
	MOVL	call+0(FP), BX
	MOVL	args+4(FP), CX
	INT	$0x80
	MOVLQSX	AX, AX
	MOVQ	AX, ret+8(FP)
	RET
