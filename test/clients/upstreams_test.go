//go:build linux

package clients

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// The packages every registry serves: one small package each, built here.
const (
	pkgName    = "tn-demo" // pip, npm and cargo
	pyModule   = "tn_demo" // what pip installs
	goModule   = "clients.test/tndemo"
	pkgVersion = "0.1.0"
	greeting   = "hello from tn-demo"
)

// testCA makes a CA and a certificate for *.clients.test signed by it; it
// writes the CA's PEM to caFile.
func testCA(t *testing.T, caFile string) tls.Certificate {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "trialnet clients test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "*." + domain},
		DNSNames: []string{"*." + domain, "*.wild." + domain}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key}
}

// upstreams serves every registry on every name of the test domain, by
// path: /hello, /ws (a WebSocket echo), /git/ (smart HTTP), /simple/ and /files/ (a PEP 503
// index), /npm/ (a registry), /goproxy/ (a GOPROXY), /index/ and /crates/
// (a cargo sparse registry). URLs in documents name the host asked for.
func upstreams(t *testing.T, gitRoot string) http.Handler {
	t.Helper()
	wheel, wheelName := buildWheel(t)
	npmTgz := buildTarGz(t, map[string]string{
		"package/package.json": fmt.Sprintf(`{"name":%q,"version":%q,"main":"index.js"}`, pkgName, pkgVersion),
		"package/index.js":     fmt.Sprintf("module.exports = { greeting: %q };\n", greeting),
	})
	crate := buildTarGz(t, map[string]string{
		pkgName + "-" + pkgVersion + "/Cargo.toml": fmt.Sprintf("[package]\nname = %q\nversion = %q\nedition = \"2021\"\n", pkgName, pkgVersion),
		pkgName + "-" + pkgVersion + "/src/lib.rs": fmt.Sprintf("pub const GREETING: &str = %q;\n", greeting),
	})
	goZip := buildZip(t, map[string]string{
		goModule + "@v" + pkgVersion + "/go.mod":    "module " + goModule + "\n\ngo 1.21\n",
		goModule + "@v" + pkgVersion + "/tndemo.go": fmt.Sprintf("package tndemo\n\nconst Greeting = %q\n", greeting),
	})
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", r.Host)
	})
	// A WebSocket echo. Server, not Handler: Handler refuses a client that
	// sends no Origin, as Python's websockets does not.
	mux.Handle("GET /ws", websocket.Server{Handler: func(c *websocket.Conn) { _, _ = io.Copy(c, c) }})
	mux.Handle("/git/", &cgi.Handler{Path: gitPath, Root: "/git", Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + gitRoot, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + gitRoot}})

	mux.HandleFunc("GET /simple/"+pkgName+"/", func(w http.ResponseWriter, r *http.Request) {
		sum := sha256.Sum256(wheel)
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/files/%s#sha256=%x\">%s</a></body></html>\n", wheelName, sum, wheelName)
	})
	mux.HandleFunc("GET /files/"+wheelName, blob(wheel, "application/octet-stream"))

	mux.HandleFunc("GET /npm/"+pkgName, func(w http.ResponseWriter, r *http.Request) {
		sha := sha512.Sum512(npmTgz)
		sha1sum := sha1.Sum(npmTgz)
		tarball := fmt.Sprintf("https://%s/npm/%s/-/%s-%s.tgz", r.Host, pkgName, pkgName, pkgVersion)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"name": pkgName, "dist-tags": map[string]string{"latest": pkgVersion},
			"versions": map[string]any{pkgVersion: map[string]any{
				"name": pkgName, "version": pkgVersion, "main": "index.js",
				"dist": map[string]string{"tarball": tarball, "shasum": hex.EncodeToString(sha1sum[:]),
					"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha[:])},
			}},
		})
	})
	mux.HandleFunc(fmt.Sprintf("GET /npm/%s/-/%s-%s.tgz", pkgName, pkgName, pkgVersion), blob(npmTgz, "application/octet-stream"))

	gp := "/goproxy/" + goModule + "/@v/"
	mux.HandleFunc("GET "+gp+"list", blob([]byte("v"+pkgVersion+"\n"), "text/plain"))
	mux.HandleFunc("GET "+gp+"v"+pkgVersion+".info", blob([]byte(`{"Version":"v`+pkgVersion+`","Time":"2025-01-01T00:00:00Z"}`), "application/json"))
	mux.HandleFunc("GET "+gp+"v"+pkgVersion+".mod", blob([]byte("module "+goModule+"\n\ngo 1.21\n"), "text/plain"))
	mux.HandleFunc("GET "+gp+"v"+pkgVersion+".zip", blob(goZip, "application/zip"))

	mux.HandleFunc("GET /index/config.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"dl":"https://%s/crates"}`, r.Host)
	})
	crateSum := sha256.Sum256(crate)
	// A name of four or more characters lives at ab/cd/name.
	mux.HandleFunc("GET /index/"+pkgName[:2]+"/"+pkgName[2:4]+"/"+pkgName, blob([]byte(fmt.Sprintf(
		`{"name":%q,"vers":%q,"deps":[],"cksum":"%x","features":{},"yanked":false}`+"\n", pkgName, pkgVersion, crateSum)), "text/plain"))
	mux.HandleFunc("GET /crates/"+pkgName+"/"+pkgVersion+"/download", blob(crate, "application/octet-stream"))
	return mux
}

func blob(b []byte, contentType string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		_, _ = w.Write(b)
	}
}

// buildWheel makes a pure-Python wheel with the RECORD pip verifies.
func buildWheel(t *testing.T) ([]byte, string) {
	t.Helper()
	info := pyModule + "-" + pkgVersion + ".dist-info/"
	files := map[string]string{
		pyModule + "/__init__.py": fmt.Sprintf("GREETING = %q\n", greeting),
		info + "METADATA":         "Metadata-Version: 2.1\nName: " + pkgName + "\nVersion: " + pkgVersion + "\n",
		info + "WHEEL":            "Wheel-Version: 1.0\nGenerator: trialnet-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	var record strings.Builder
	for name, body := range files {
		sum := sha256.Sum256([]byte(body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", name, base64.RawURLEncoding.EncodeToString(sum[:]), len(body))
	}
	record.WriteString(info + "RECORD,,\n")
	files[info+"RECORD"] = record.String()
	return buildZip(t, files), pyModule + "-" + pkgVersion + "-py3-none-any.whl"
}

func buildZip(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range files {
		w, err := zw.Create(name)
		if err == nil {
			_, err = w.Write([]byte(body))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func buildTarGz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gitRepo makes a bare repository demo.git under root with one commit
// and returns a function that pushes another and returns its hash.
func gitRepo(t *testing.T, root string) (commit func() string) {
	t.Helper()
	work := filepath.Join(root, "work")
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + root, "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@clients.test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@clients.test"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git(root, "init", "-q", "--bare", "-b", "main", "demo.git")
	git(root, "init", "-q", "-b", "main", work)
	n := 0
	return func() string {
		n++
		if err := os.WriteFile(filepath.Join(work, "README"), []byte(fmt.Sprintf("commit %d\n", n)), 0o644); err != nil {
			t.Fatal(err)
		}
		git(work, "add", "README")
		git(work, "commit", "-q", "-m", fmt.Sprintf("commit %d", n))
		git(work, "push", "-q", filepath.Join(root, "demo.git"), "main")
		return git(work, "rev-parse", "HEAD")
	}
}
