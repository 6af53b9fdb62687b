// Package exepages gives back the pages of the running binary that only its
// start touched.
//
// Starting ichor runs the init functions of some 1,500 packages (OPA's
// builtins and ast, client-go's and the API types' schemes, Talos
// machinery's tables), spread across the whole binary; with the kernel's
// fault-around, each first touch maps 64 KiB of it. An idle `ichor` holds
// about 65 MiB of its 150 MB binary resident that way, most of which it never
// reads again, and which counts in its resident set. Release drops the
// process's mappings of those pages (they are clean copies of the file, so
// nothing is lost or written): what the manager uses afterwards is mapped
// again from the page cache at its next touch, and what it does not use
// stays out.
package exepages

import "errors"

// Released is the binary's resident pages before and after a Release, in
// bytes (RssFile of /proc/self/status: every file mapped, the binary most of
// it).
type Released struct {
	FileBefore, FileAfter int64
}

// ErrUnsupported is Release's error where the kernel cannot drop a mapping's
// pages.
var ErrUnsupported = errors.New("dropping the binary's mapped pages is not supported here")
