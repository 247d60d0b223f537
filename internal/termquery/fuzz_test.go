package termquery

import "testing"

// What a Trial writes is the parser's input: any bytes, split anywhere,
// read the same as whole, and never a panic.
func FuzzOutput(f *testing.F) {
	for _, s := range []string{"\x1b[6n", "\x9b6n", "\xc4\x9b6n", "\x1b]11;?\x07", "\x1bP$qm\x1b\\", "\x1b[?1000h", "plain", "\x1b[5n\x18"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var whole, bytewise Output
		_, _ = whole.Write(b)
		for i := range b {
			_, _ = bytewise.Write(b[i : i+1])
		}
		wq, ws := whole.Pending()
		bq, bs := bytewise.Pending()
		if wq != bq || ws != bs || whole.Quiet() != bytewise.Quiet() {
			t.Fatalf("%q: whole (%v, %d, quiet %v), byte by byte (%v, %d, quiet %v)", b, wq, ws, whole.Quiet(), bq, bs, bytewise.Quiet())
		}
	})
}

// What the terminal (or the operator) sends is counted the same whole as
// byte by byte, and never a panic.
func FuzzAnswers(f *testing.F) {
	for _, s := range []string{"\x1b[0n", "\x9b3n", "\xc2\x9b0n", "\xc4\x9b0n", "\x1b[200~\x1b[0n\x1b[201~", "\x1b[2;1R\x1b[0n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var whole, bytewise Answers
		n := whole.Scan(b)
		m := 0
		for i := range b {
			m += bytewise.Scan(b[i : i+1])
		}
		if n != m {
			t.Fatalf("%q: %d status reports whole, %d byte by byte", b, n, m)
		}
	})
}
