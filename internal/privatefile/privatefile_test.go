package privatefile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ichor-dev/ichor-policy/internal/privatefile"
)

func TestWriteIsPrivateWhateverItReplaces(t *testing.T) {
	dir := t.TempDir()
	for name, prepare := range map[string]func(path string) error{
		"new":          func(string) error { return nil },
		"loose mode":   func(path string) error { return os.WriteFile(path, []byte("old"), 0o644) },
		"world writes": func(path string) error { return os.WriteFile(path, []byte("old"), 0o666) },
		"a link": func(path string) error {
			target := filepath.Join(dir, "target-"+filepath.Base(path))
			if err := os.WriteFile(target, []byte("target"), 0o644); err != nil {
				return err
			}
			return os.Symlink(target, path)
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name)
			if err := prepare(path); err != nil {
				t.Fatal(err)
			}
			if err := privatefile.Write(path, []byte("secret")); err != nil {
				t.Fatal(err)
			}
			info, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if !info.Mode().IsRegular() || info.Mode().Perm() != privatefile.Mode {
				t.Fatalf("mode %v, want a regular file of mode %v", info.Mode(), privatefile.Mode)
			}
			if got, _ := os.ReadFile(path); string(got) != "secret" {
				t.Fatalf("content %q", got)
			}
		})
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "target-a link")); string(got) != "target" {
		t.Fatalf("the link's target was written through: %q", got)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name()[0] == '.' {
			t.Fatalf("a temporary file is left: %s", e.Name())
		}
	}
}
