package packaging

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// needPodman skips a test that builds the container image when podman is
// missing or the test is not root (podman builds as root on CI machines).
func needPodman(t *testing.T) string {
	t.Helper()
	needRoot(t)
	p, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed: make deps (or apt-get install podman) installs it")
	}
	return p
}

// builtImage is what one `make image` produced.
type builtImage struct {
	ref, id, bin string
}

// makeImage runs `make image` into dir under the tag and returns the image.
func makeImage(t *testing.T, dir, tag string) builtImage {
	t.Helper()
	img := builtImage{ref: "localhost/rld-test:" + tag, bin: filepath.Join(dir, "rld")}
	iid := filepath.Join(dir, "image.id")
	cmd := exec.Command("make", "-s", "-C", top, "image", "BIN="+img.bin, "IMAGE=localhost/rld-test",
		"IMAGE_TAG="+tag, "IMAGE_CONTEXT="+filepath.Join(dir, "context"), "IMAGE_IIDFILE="+iid)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make image:\n%s", out)
	b, err := os.ReadFile(iid)
	require.NoError(t, err)
	img.id = strings.TrimPrefix(strings.TrimSpace(string(b)), "sha256:")
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", img.ref).Run() })
	return img
}

// imageInspect is the part of `podman image inspect` the test reads.
type imageInspect struct {
	ID     string `json:"Id"`
	Size   int64  `json:"Size"`
	Config struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Labels     map[string]string `json:"Labels"`
	} `json:"Config"`
}

// TestImage: `make image` builds a minimal image: a non-root user, the
// stamped version and commit in the OCI labels, one file (the static
// binary make built, so no shell), and the same image ID when built again
// from the same commit.
func TestImage(t *testing.T) {
	t.Parallel()
	podman := needPodman(t)
	dir := t.TempDir()
	img := makeImage(t, filepath.Join(dir, "a"), "a")

	out, err := exec.Command(podman, "image", "inspect", img.ref).Output()
	require.NoError(t, err)
	var ins []imageInspect
	require.NoError(t, json.Unmarshal(out, &ins))
	require.Len(t, ins, 1)
	in := ins[0]
	t.Logf("image %s: %d bytes, user %s, labels %v", img.ref, in.Size, in.Config.User, in.Config.Labels)
	assert.Equal(t, img.id, in.ID)
	assert.Equal(t, "65532:65532", in.Config.User, "a numeric non-root uid:gid (runAsNonRoot can verify it)")
	assert.Equal(t, []string{"/rld"}, in.Config.Entrypoint)
	assert.Equal(t, []string{"serve", "-config", "/etc/rld/rld.toml"}, in.Config.Cmd)
	version := script(t, "version")
	assert.Equal(t, version, in.Config.Labels["org.opencontainers.image.version"])
	assert.Equal(t, script(t, "commit"), in.Config.Labels["org.opencontainers.image.revision"])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, in.Config.Labels["org.opencontainers.image.created"])
	assert.Less(t, in.Size, int64(20<<20), "the image is the binary and little else")

	files := imageFiles(t, podman, img.ref, dir)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	assert.Equal(t, []string{"rld"}, names, "the image holds the binary only: no shell, no libc")
	bin, err := os.ReadFile(img.bin)
	require.NoError(t, err)
	assert.Equal(t, sha256.Sum256(bin), sha256.Sum256(files["rld"]), "/rld is the binary make built")
	assertStatic(t, files["rld"])
	v, err := exec.Command(img.bin, "version").Output()
	require.NoError(t, err)
	assert.Contains(t, string(v), version, "the binary carries the version the label names")

	again := makeImage(t, filepath.Join(dir, "b"), "b")
	assert.Equal(t, img.id, again.id, "the same commit builds the same image")
}

// script runs scripts/version.sh with the argument.
func script(t *testing.T, arg string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(top, "scripts", "version.sh"), arg).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// imageFiles saves the image as an OCI archive and returns the regular
// files and links of its layers by path (directories are left out).
func imageFiles(t *testing.T, podman, ref, dir string) map[string][]byte {
	t.Helper()
	archive := filepath.Join(dir, "image.oci.tar")
	out, err := exec.Command(podman, "image", "save", "--format", "oci-archive", "-o", archive, ref).CombinedOutput()
	require.NoError(t, err, "podman image save: %s", out)
	blobs := readTar(t, archive)
	var index, manifest struct {
		Manifests []struct{ Digest string } `json:"manifests"`
		Layers    []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(blobs["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	require.NoError(t, json.Unmarshal(blobs[blobPath(index.Manifests[0].Digest)], &manifest))
	files := map[string][]byte{}
	for _, l := range manifest.Layers {
		var r io.Reader = bytes.NewReader(blobs[blobPath(l.Digest)])
		if strings.HasSuffix(l.MediaType, "gzip") {
			zr, err := gzip.NewReader(r)
			require.NoError(t, err)
			r = zr
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			if h.Typeflag == tar.TypeDir {
				continue
			}
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			files[strings.TrimPrefix(h.Name, "./")] = b
		}
	}
	return files
}

// blobPath is where an OCI layout keeps the blob of a digest.
func blobPath(digest string) string {
	algo, hex, _ := strings.Cut(digest, ":")
	return fmt.Sprintf("blobs/%s/%s", algo, hex)
}

// readTar returns every regular file of a tar archive by name.
func readTar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			files[strings.TrimPrefix(h.Name, "./")] = b
		}
	}
}

// assertStatic asserts the ELF binary asks for no dynamic loader.
func assertStatic(t *testing.T, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	require.NoError(t, err)
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "a static binary has no interpreter")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	assert.Empty(t, libs)
}
