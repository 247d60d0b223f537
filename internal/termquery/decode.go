package termquery

import "unicode/utf8"

// decoder splits bytes into UTF-8 code points across writes.
type decoder struct {
	carry [utf8.UTFMax]byte
	n     int // bytes of an unfinished character
}

// feed calls fn with each code point of p, after what an earlier feed
// left unfinished; a byte that starts no valid character is passed alone
// with bad set.
func (d *decoder) feed(p []byte, fn func(r rune, bad bool)) {
	for {
		if d.n > 0 {
			k := copy(d.carry[d.n:], p)
			buf := d.carry[:d.n+k]
			if !utf8.FullRune(buf) {
				d.n += k // all of p: a full carry is always a full rune
				return
			}
			r, size := utf8.DecodeRune(buf)
			bad := r == utf8.RuneError && size == 1
			if bad {
				r = rune(buf[0])
			}
			if size >= d.n {
				p = p[size-d.n:]
				d.n = 0
			} else {
				copy(d.carry[:], d.carry[size:d.n])
				d.n -= size
			}
			fn(r, bad)
			continue
		}
		if len(p) == 0 {
			return
		}
		if b := p[0]; b < utf8.RuneSelf {
			fn(rune(b), false)
			p = p[1:]
			continue
		}
		if !utf8.FullRune(p) {
			d.n = copy(d.carry[:], p)
			return
		}
		r, size := utf8.DecodeRune(p)
		bad := r == utf8.RuneError && size == 1
		if bad {
			r = rune(p[0])
		}
		fn(r, bad)
		p = p[size:]
	}
}
