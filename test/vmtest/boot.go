//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const virtiofsd = "/usr/lib/qemu/virtiofsd"

// boot is one guest: a kernel of the matrix, its files and its results.
type boot struct {
	k       kernel
	release string // e.g. 6.12.107+deb12-cloud-amd64
	vmlinuz string
	modDir  string // /lib/modules/<release>
	dir     string // this guest's output directory
	res     *guestResult
	err     error
}

// findKernel picks the newest installed kernel whose release starts with
// k.Prefix; its modules are where the Debian package put them, which the
// guest reads through the root share.
func findKernel(k kernel, pinned []string) (*boot, error) {
	matches, _ := filepath.Glob("/boot/vmlinuz-" + k.Prefix + "*")
	var rels []string
	for _, m := range matches {
		rel := strings.TrimPrefix(m, "/boot/vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", rel, "modules.dep")); err == nil {
			rels = append(rels, rel)
		}
	}
	for _, p := range pinned {
		if strings.HasPrefix(p, k.Prefix) {
			if !slices.Contains(rels, p) {
				return nil, fmt.Errorf("kernel %s: release %s is pinned but not installed with its modules: 'make vm-deps' installs it", k.Name, p)
			}
			rels = []string{p}
		}
	}
	if len(rels) == 0 {
		return nil, fmt.Errorf("kernel %s: no /boot/vmlinuz-%s* with its modules: 'make vm-deps' installs Debian's kernels", k.Name, k.Prefix)
	}
	slices.SortFunc(rels, compareVersions)
	rel := rels[len(rels)-1]
	return &boot{k: k, release: rel, vmlinuz: "/boot/vmlinuz-" + rel, modDir: filepath.Join("/lib/modules", rel)}, nil
}

// compareVersions orders releases by their numeric fields (6.1.0-9 before
// 6.1.0-10).
func compareVersions(a, b string) int {
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' || r == '+' })
	}
	fa, fb := split(a), split(b)
	for i := 0; i < len(fa) && i < len(fb); i++ {
		var na, nb int
		_, ea := fmt.Sscanf(fa[i], "%d", &na)
		_, eb := fmt.Sscanf(fb[i], "%d", &nb)
		if ea == nil && eb == nil && na != nb {
			return na - nb
		}
		if ea != nil || eb != nil {
			if c := strings.Compare(fa[i], fb[i]); c != 0 {
				return c
			}
		}
	}
	return len(fa) - len(fb)
}

func (b *boot) console() string     { return filepath.Join(b.dir, "console.log") }
func (b *boot) resultsFile() string { return filepath.Join(b.dir, "results.log") }

// run boots the guest and waits for it to power off.
func (b *boot) run(ctx context.Context, o *options, bins *built) error {
	b.dir = filepath.Join(o.out, b.k.Name)
	_ = os.RemoveAll(b.dir)
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return err
	}
	p := bins.plan(b.k, o)
	gotest := map[string]bool{}
	for _, s := range p.Steps {
		gotest[s.Name] = s.GoTest
	}
	planPath := filepath.Join(b.dir, "plan.json")
	if err := writeJSON(planPath, p); err != nil {
		return err
	}
	initrd := filepath.Join(b.dir, "initramfs.cpio")
	if err := b.initramfs(initrd, bins.init); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	sock := filepath.Join(b.dir, "virtiofs.sock")
	fsd, err := startVirtiofsd(filepath.Join(b.dir, "root"), sock, o.keeps)
	if err != nil {
		return err
	}
	defer func() {
		_ = fsd.Process.Kill()
		_ = fsd.Wait()
	}()
	total := time.Minute
	for _, s := range p.Steps {
		total += time.Duration(s.Timeout) * time.Second
	}
	qctx, cancel := context.WithTimeout(ctx, total)
	defer cancel()
	cmd := exec.CommandContext(qctx, "qemu-system-x86_64", b.qemuArgs(o, initrd, sock, planPath)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives vmtest
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	fmt.Printf("vmtest: booting %s (%s)\n", b.k.Name, b.release)
	start := time.Now()
	err = cmd.Run()
	fmt.Printf("vmtest: %s powered off after %.0fs\n", b.k.Name, time.Since(start).Seconds())
	if f, oerr := os.Open(b.resultsFile()); oerr == nil {
		b.res, _ = parseResults(bufio.NewReader(f), gotest)
		_ = f.Close()
	}
	if qctx.Err() != nil {
		return fmt.Errorf("the guest ran past %s and was stopped", total)
	}
	if err != nil {
		return fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (b *boot) qemuArgs(o *options, initrd, sock, planPath string) []string {
	cmdline := "console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init vmtest.plan=" + planPath
	for _, k := range o.keeps {
		cmdline += " vmtest.keep=" + k
	}
	if b.k.Append != "" {
		cmdline += " " + b.k.Append
	}
	return []string{
		"-accel", o.accel.arg(), "-cpu", o.accel.cpu, "-m", o.mem, "-smp", fmt.Sprint(o.smp),
		"-nodefaults", "-display", "none", "-no-reboot",
		"-kernel", b.vmlinuz, "-initrd", initrd, "-append", cmdline,
		"-serial", "file:" + b.console(), "-serial", "file:" + b.resultsFile(),
		"-chardev", "socket,id=rootfs,path=" + sock,
		"-device", "vhost-user-fs-pci,chardev=rootfs,tag=root",
		"-object", "memory-backend-memfd,id=mem,size=" + o.mem + ",share=on", "-numa", "node,memdev=mem",
		"-device", "virtio-rng-pci",
	}
}

// startVirtiofsd serves the host's root read-only: in a mount namespace of
// its own, / is bind-mounted read-only on view and virtiofsd shares view,
// so no guest write reaches the host, whatever the guest mounts. The
// filesystems that hold keeps, if not the root's, are bound in too.
func startVirtiofsd(view, sock string, keeps []string) (*exec.Cmd, error) {
	if err := os.MkdirAll(view, 0o755); err != nil {
		return nil, err
	}
	_ = os.Remove(sock)
	var mounts []string
	for _, k := range keeps {
		m, err := mountPoint(k)
		if err != nil {
			return nil, err
		}
		if m != "/" && !slices.Contains(mounts, m) {
			mounts = append(mounts, m)
		}
	}
	script := `v=$1 fsd=$2 sock=$3; shift 3
mount --bind / "$v" && mount -o remount,bind,ro "$v" || exit 1
for m; do mount --bind "$m" "$v$m" && mount -o remount,bind,ro "$v$m" || exit 1; done
exec "$fsd" --socket-path="$sock" -o source="$v" -o cache=always -o sandbox=chroot -o no_posix_lock`
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "sh", view, virtiofsd, sock}, mounts...)...)
	// Go makes the new mount namespace's mounts private before the exec.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	log, err := os.Create(filepath.Join(filepath.Dir(sock), "virtiofsd.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start virtiofsd: %w", err)
	}
	_ = log.Close()
	for range 100 {
		if _, err := os.Stat(sock); err == nil {
			return cmd, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return nil, fmt.Errorf("virtiofsd made no socket at %s (see virtiofsd.log beside it)", sock)
}

// initramfs writes the guest's first root: this program as /init, and the
// modules the root share needs where the kernel has them as modules
// (Debian 6.1: virtio_pci, fuse, virtiofs), dependencies first.
func (b *boot) initramfs(path, init string) error {
	self, err := os.ReadFile(init)
	if err != nil {
		return err
	}
	mods, err := moduleClosure(b.modDir, []string{"virtio_pci", "virtiofs"})
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	c := &cpioWriter{w: w}
	for _, d := range []string{"dev", "proc", "sys", "newroot", "modules"} {
		c.dir(d)
	}
	c.chardev("dev/console", 5, 1)
	c.file("init", self, 0o755)
	var order []string
	for _, m := range mods {
		data, err := os.ReadFile(filepath.Join(b.modDir, m))
		if err != nil {
			return err
		}
		name := filepath.Base(m)
		c.file("modules/"+name, data, 0o644)
		order = append(order, name)
	}
	c.file("modules/order", []byte(strings.Join(order, "\n")+"\n"), 0o644)
	if err := c.close(); err != nil {
		return err
	}
	return w.Flush()
}

// moduleClosure lists the module files (relative to modDir) that loading
// names needs, dependencies before dependents, leaving out what the
// kernel has built in.
func moduleClosure(modDir string, names []string) ([]string, error) {
	dep, err := os.ReadFile(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin, _ := os.ReadFile(filepath.Join(modDir, "modules.builtin"))
	modName := func(p string) string {
		base, _, _ := strings.Cut(filepath.Base(p), ".ko")
		return strings.ReplaceAll(base, "-", "_")
	}
	isBuiltin := map[string]bool{}
	for _, l := range strings.Fields(string(builtin)) {
		isBuiltin[modName(l)] = true
	}
	files, deps := map[string]string{}, map[string][]string{}
	for _, line := range strings.Split(string(dep), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		files[modName(mod)] = mod
		deps[modName(mod)] = strings.Fields(rest)
	}
	var out []string
	seen := map[string]bool{}
	var visit func(string) error
	visit = func(n string) error {
		if seen[n] || isBuiltin[n] {
			return nil
		}
		seen[n] = true
		file, ok := files[n]
		if !ok {
			return fmt.Errorf("module %s: neither built in nor in %s/modules.dep", n, modDir)
		}
		for _, d := range deps[n] {
			if err := visit(modName(d)); err != nil {
				return err
			}
		}
		out = append(out, file)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}
