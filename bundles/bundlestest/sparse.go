// Package bundlestest builds hostile bundles for the tests of the packages
// that must refuse them.
package bundlestest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"strconv"
)

// SparseBomb is a gzipped tar of files entries, each a PAX 1.0 sparse file
// ("GNU.sparse.*" records, type '0') that declares realSize bytes and
// carries one 512-byte block: 40 entries of 8 MiB are about 1 KiB, and
// archive/tar expands them to 320 MiB of zeros. Go's tar.Writer drops
// GNU.sparse records, so the blocks are written by hand.
func SparseBomb(files int, realSize int64) []byte {
	var tarb []byte
	for i := range files {
		name := fmt.Sprintf("x%d/data.json", i)
		pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
			paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", strconv.FormatInt(realSize, 10))
		tarb = append(tarb, header("PaxHeaders/x", 'x', int64(len(pax)))...)
		tarb = append(tarb, pad([]byte(pax))...)
		tarb = append(tarb, header("sparse", '0', 512)...)
		// The sparse map: no data region, all hole.
		tarb = append(tarb, pad([]byte("0\n"))...)
	}
	tarb = append(tarb, make([]byte, 1024)...)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write(tarb) // a bytes.Buffer does not fail
	_ = w.Close()
	return gz.Bytes()
}

func octal(b []byte, v int64) {
	s := strconv.FormatInt(v, 8)
	for len(s) < len(b)-1 {
		s = "0" + s
	}
	copy(b, s)
}

func header(name string, typ byte, size int64) []byte {
	h := make([]byte, 512)
	copy(h[0:100], name)
	octal(h[100:108], 0o644)
	octal(h[108:116], 0)
	octal(h[116:124], 0)
	octal(h[124:136], size)
	octal(h[136:148], 0)
	h[156] = typ
	copy(h[257:263], "ustar\x00")
	copy(h[263:265], "00")
	for i := 148; i < 156; i++ {
		h[i] = ' '
	}
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

func pad(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

// paxRecord is "<len> key=value\n", len counting itself.
func paxRecord(k, v string) string {
	s := " " + k + "=" + v + "\n"
	n := len(s)
	for {
		l := len(strconv.Itoa(n)) + len(s)
		if l == n {
			break
		}
		n = l
	}
	return strconv.Itoa(n) + s
}
