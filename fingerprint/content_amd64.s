//go:build !purego

#include "textflag.h"

// func passContentAVX2(data []byte, i int, buf []byte, o int, kept *[256]bool) (ni, no int, high, escaped bool)
//
// AX: i, BX: o, DX and CX: the last i and o with 32 bytes to read and to
// write; Y1, Y2, Y3: '"', '\\' and 0x1f in every byte; R8 and R9: the
// marked bytes and the bytes >= 0x80 of the block at AX; R11: the bytes
// >= 0x80 passed (low 32 bits) and whether an escape was (bit 40).
TEXT ·passContentAVX2(SB), NOSPLIT, $0-90
	MOVQ data_base+0(FP), SI
	MOVQ data_len+8(FP), DX
	MOVQ i+24(FP), AX
	MOVQ buf_base+32(FP), DI
	MOVQ buf_len+40(FP), CX
	MOVQ o+56(FP), BX
	MOVQ kept+64(FP), R10
	XORQ R11, R11
	MOVL $0x22, R9
	MOVQ R9, X1
	VPBROADCASTB X1, Y1
	MOVL $0x5c, R9
	MOVQ R9, X2
	VPBROADCASTB X2, Y2
	MOVL $0x1f, R9
	MOVQ R9, X3
	VPBROADCASTB X3, Y3
	SUBQ $32, DX
	SUBQ $32, CX

loop:
	CMPQ      AX, DX
	JGT       done
	CMPQ      BX, CX
	JGT       done
	VMOVDQU   (SI)(AX*1), Y0
	VMOVDQU   Y0, (DI)(BX*1)
	VPCMPEQB  Y1, Y0, Y4
	VPCMPEQB  Y2, Y0, Y5
	VPMINUB   Y3, Y0, Y6
	VPCMPEQB  Y6, Y0, Y6
	VPOR      Y4, Y5, Y4
	VPOR      Y6, Y4, Y4
	VPMOVMSKB Y4, R8
	VPMOVMSKB Y0, R9
	TESTQ     R8, R8
	JNZ       marked

passed: // the whole block
	ORQ  R9, R11
	ADDQ $32, AX
	ADDQ $32, BX
	JMP  loop

marked:
	BSFQ    R8, R13 // k, the block's first marked byte
	LEAQ    (AX)(R13*1), R15
	MOVBLZX (SI)(R15*1), R14
	CMPL    R14, $0x5c
	JNE     stop // a quote or a control character
	CMPQ    R13, $31
	JEQ     last
	MOVBLZX 1(SI)(R15*1), R14
	MOVBLZX (R10)(R14*1), R12
	TESTL   R12, R12
	JZ      other // an escape to decode, or an invalid one
	BTSQ    $40, R11
	BTRQ    R13, R8 // the backslash
	INCQ    R13
	BTRQ    R13, R8 // and what it escapes, marked if a quote or a backslash
	TESTQ   R8, R8
	JNZ     marked
	JMP     passed

last: // a backslash in the block's last byte: what it escapes is past the block
	CMPQ    AX, DX
	JEQ     stop // and may be past the data
	CMPQ    BX, CX
	JEQ     stop // or past buf
	MOVBLZX 32(SI)(AX*1), R14
	MOVBLZX (R10)(R14*1), R15
	TESTL   R15, R15
	JZ      stop
	MOVB    R14, 32(DI)(BX*1)
	BTSQ    $40, R11
	ORQ     R9, R11
	ADDQ    $33, AX
	ADDQ    $33, BX
	JMP     loop

other: // the escape at k is not kept: \u of a character that stands for itself is decoded here
	CMPL R14, $0x75
	JNE  stop
	MOVQ R8, R14
	NEGQ R14
	ANDQ R8, R14
	DECQ R14
	ANDQ R14, R9
	ORQ  R9, R11
	ADDQ R13, AX
	ADDQ R13, BX // AX and BX at the backslash; R8, R9, R12-R15 free
	LEAQ 26(DX), R14
	CMPQ AX, R14
	JGT  done // fewer than six bytes of data
	LEAQ 29(CX), R14
	CMPQ BX, R14
	JGT  done // fewer than three of buf
	LEAQ    ·hexValue(SB), R12
	MOVBLZX 2(SI)(AX*1), R13
	MOVL    (R12)(R13*4), R8
	SHLL    $12, R8
	MOVBLZX 3(SI)(AX*1), R13
	MOVL    (R12)(R13*4), R9
	SHLL    $8, R9
	ORL     R9, R8
	MOVBLZX 4(SI)(AX*1), R13
	MOVL    (R12)(R13*4), R9
	SHLL    $4, R9
	ORL     R9, R8
	MOVBLZX 5(SI)(AX*1), R13
	MOVL    (R12)(R13*4), R9
	ORL     R9, R8 // negative unless four hexadecimal digits
	CMPL    R8, $0x20
	JLT     done // or a control character: the caller's, as a quote and a backslash are
	CMPL    R8, $0x22
	JEQ     done // a quote
	CMPL    R8, $0x5c
	JEQ     done // a backslash
	BTSQ    $40, R11
	ADDQ    $6, AX
	CMPL    R8, $0x80
	JLT     one
	CMPL    R8, $0x800
	JLT     two
	MOVL    R8, R9
	ANDL    $0xf800, R9
	CMPL    R9, $0xd800
	JEQ     surrogate
	MOVL    R8, R9
	SHRL    $12, R9
	ORL     $0xe0, R9
	MOVB    R9, (DI)(BX*1)
	MOVL    R8, R9
	SHRL    $6, R9
	ANDL    $0x3f, R9
	ORL     $0x80, R9
	MOVB    R9, 1(DI)(BX*1)
	ANDL    $0x3f, R8
	ORL     $0x80, R8
	MOVB    R8, 2(DI)(BX*1)
	ADDQ    $3, BX
	JMP     loop

two:
	MOVL R8, R9
	SHRL $6, R9
	ORL  $0xc0, R9
	MOVB R9, (DI)(BX*1)
	ANDL $0x3f, R8
	ORL  $0x80, R8
	MOVB R8, 1(DI)(BX*1)
	ADDQ $2, BX
	JMP  loop

one:
	MOVB R8, (DI)(BX*1)
	INCQ BX
	JMP  loop

surrogate: // half of a pair, or unpaired: the caller's
	SUBQ $6, AX
	JMP  done

stop:
	MOVQ R8, R14
	NEGQ R14
	ANDQ R8, R14
	DECQ R14 // the bits below the first marked
	ANDQ R14, R9
	ORQ  R9, R11
	ADDQ R13, AX
	ADDQ R13, BX

done:
	VZEROUPPER
	MOVQ  AX, ni+72(FP)
	MOVQ  BX, no+80(FP)
	TESTL R11, R11
	SETNE high+88(FP)
	BTQ   $40, R11
	SETCS escaped+89(FP)
	RET
