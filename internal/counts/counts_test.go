//go:build linux

package counts

import (
	"os"
	"testing"
)

// Two mappings of one page, as two processes have them, see each other's
// words; a page that is not a sealed counts page is refused.
func TestRegionShared(t *testing.T) {
	r, err := New("test")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := r.Dup()
	if err != nil {
		t.Fatal(err)
	}
	other, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	r.Slot(1).Tunnels.Add(3)
	r.LogBytes().Add(100)
	if got := other.Slot(1).Tunnels.Load(); got != 3 {
		t.Errorf("the other mapping sees %d tunnels in slot 1, want 3", got)
	}
	if got := other.LogBytes().Load(); got != 100 {
		t.Errorf("the other mapping sees %d log bytes, want 100", got)
	}
	if other.Slot(0).Tunnels.Load() != 0 {
		t.Error("slot 0 counts slot 1's tunnels")
	}
	other.Clear(1)
	if got := r.Slot(1).Tunnels.Load(); got != 0 {
		t.Errorf("slot 1 holds %d after Clear", got)
	}

	plain, err := os.CreateTemp(t.TempDir(), "page")
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Truncate(pageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(plain); err == nil {
		t.Error("a plain file of a page's size was taken for a counts page: its size can change under the mapping")
	}
}
