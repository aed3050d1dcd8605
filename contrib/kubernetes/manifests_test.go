package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// manifests are the files under contrib/kubernetes.
var manifests = []string{"sidecar.yaml", "daemonset.yaml"}

// strict decodes YAML into the API types of core/v1 and apps/v1, refusing
// unknown and duplicate fields.
var strict = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// decodeAll decodes every document of a multi-document YAML stream.
func decodeAll(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
}

// manifest is one file's objects: its ConfigMap and its workload's pod.
type manifest struct {
	config *corev1.ConfigMap
	pod    corev1.PodSpec
	rld    corev1.Container // the rld container (a sidecar in sidecar.yaml)
}

// load decodes a manifest strictly and picks out its parts.
func load(t *testing.T, name string) manifest {
	t.Helper()
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	objs, err := decodeAll(data)
	require.NoError(t, err, "%s must decode strictly into the Kubernetes API types", name)
	var m manifest
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ConfigMap:
			m.config = o
		case *appsv1.Deployment:
			m.pod = o.Spec.Template.Spec
		case *appsv1.DaemonSet:
			m.pod = o.Spec.Template.Spec
		default:
			t.Fatalf("%s: unexpected object %T", name, o)
		}
	}
	require.NotNil(t, m.config, "%s has rld's ConfigMap", name)
	for _, c := range append(append([]corev1.Container{}, m.pod.InitContainers...), m.pod.Containers...) {
		if len(c.Args) > 0 && c.Args[0] == "serve" {
			m.rld = c
		}
	}
	require.NotEmpty(t, m.rld.Name, "%s runs rld serve", name)
	return m
}

// rldConfig is the part of rld.toml the tests read.
type rldConfig struct {
	Server struct {
		Socket       string `toml:"socket"`
		SocketMode   string `toml:"socket_mode"`
		HTTP         string `toml:"http"`
		DrainTimeout string `toml:"drain_timeout"`
	} `toml:"server"`
	Rules []struct {
		Name  string            `toml:"name"`
		Match map[string]string `toml:"match"`
		By    []string          `toml:"by"`
		Limit int               `toml:"limit"`
	} `toml:"rule"`
}

// config parses the rld.toml of the manifest's ConfigMap.
func (m manifest) toml(t *testing.T) (string, rldConfig) {
	t.Helper()
	text, ok := m.config.Data["rld.toml"]
	require.True(t, ok, "the ConfigMap holds rld.toml")
	var c rldConfig
	_, err := toml.Decode(text, &c)
	require.NoError(t, err)
	return text, c
}

// mount returns the container's mount of the named volume.
func mount(t *testing.T, c corev1.Container, volume string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m
		}
	}
	t.Fatalf("container %s does not mount volume %s", c.Name, volume)
	return corev1.VolumeMount{}
}

// volume returns the pod's volume of that name.
func volume(t *testing.T, pod corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range pod.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("the pod has no volume %s", name)
	return corev1.Volume{}
}

// TestManifestsDecodeStrictly: every manifest decodes into the API types
// with unknown fields refused, and the decoder used does refuse them.
func TestManifestsDecodeStrictly(t *testing.T) {
	for _, name := range manifests {
		t.Run(name, func(t *testing.T) { load(t, name) })
	}
	data, err := os.ReadFile("sidecar.yaml")
	require.NoError(t, err)
	bad := bytes.Replace(data, []byte("restartPolicy: Always "), []byte("restartPolicy: Always\n          restartPolicyy: Always "), 1)
	require.NotEqual(t, data, bad)
	_, err = decodeAll(bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown field "spec.template.spec.initContainers[0].restartPolicyy"`)
}

// TestManifestsAgree: what each manifest's parts say of one another holds:
// the socket lies in the mounted socket volume, the config file is the
// mounted ConfigMap, the probes reach the HTTP port rld listens on, rld
// runs as a non-root uid with every capability dropped, it has resource
// requests, and the drain fits in the grace period.
func TestManifestsAgree(t *testing.T) {
	for _, name := range manifests {
		t.Run(name, func(t *testing.T) {
			m := load(t, name)
			_, c := m.toml(t)
			rld := m.rld
			sock := mount(t, rld, "rld-socket")
			assert.Equal(t, sock.MountPath, filepath.Dir(c.Server.Socket), "the socket is on the shared volume")
			conf := mount(t, rld, "rld-config")
			assert.True(t, conf.ReadOnly)
			assert.Equal(t, m.config.Name, volume(t, m.pod, "rld-config").ConfigMap.Name)
			assert.Equal(t, []string{"serve", "-config", conf.MountPath + "/rld.toml"}, rld.Args)

			require.Len(t, rld.Ports, 1)
			assert.True(t, strings.HasSuffix(c.Server.HTTP, ":"+itoa(rld.Ports[0].ContainerPort)), "rld listens on the probed port")
			assert.True(t, strings.HasPrefix(c.Server.HTTP, "0.0.0.0:"), "the kubelet probes the pod's IP, not loopback")
			for _, p := range []*corev1.Probe{rld.StartupProbe, rld.ReadinessProbe, rld.LivenessProbe} {
				require.NotNil(t, p)
				assert.Equal(t, "/healthz", p.HTTPGet.Path)
				assert.Equal(t, rld.Ports[0].Name, p.HTTPGet.Port.String())
			}

			sc := rld.SecurityContext
			require.NotNil(t, sc)
			require.NotNil(t, sc.RunAsUser)
			assert.NotZero(t, *sc.RunAsUser)
			assert.Equal(t, int64(65532), *sc.RunAsUser, "the image's USER")
			assert.True(t, *sc.ReadOnlyRootFilesystem)
			assert.False(t, *sc.AllowPrivilegeEscalation)
			assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
			assert.False(t, rld.Resources.Requests.Cpu().IsZero())
			assert.False(t, rld.Resources.Requests.Memory().IsZero())
			assert.False(t, rld.Resources.Limits.Memory().IsZero())

			drain, err := time.ParseDuration(c.Server.DrainTimeout)
			require.NoError(t, err)
			require.NotNil(t, m.pod.TerminationGracePeriodSeconds)
			assert.Less(t, drain, time.Duration(*m.pod.TerminationGracePeriodSeconds)*time.Second/2,
				"the drain leaves most of the grace period to the rest of the pod")
		})
	}
}

// TestSidecarIsNative: in sidecar.yaml rld is an init container that
// restarts always, and the app shares its socket volume at the same path,
// an emptyDir owned by the pod's fsGroup, with RLD_SOCKET naming the socket.
func TestSidecarIsNative(t *testing.T) {
	m := load(t, "sidecar.yaml")
	_, c := m.toml(t)
	require.Len(t, m.pod.InitContainers, 1)
	assert.Equal(t, m.pod.InitContainers[0].Name, m.rld.Name, "rld is the init container")
	require.NotNil(t, m.rld.RestartPolicy)
	assert.Equal(t, corev1.ContainerRestartPolicyAlways, *m.rld.RestartPolicy)
	require.Len(t, m.pod.Containers, 1)
	app := m.pod.Containers[0]
	assert.Equal(t, mount(t, m.rld, "rld-socket").MountPath, mount(t, app, "rld-socket").MountPath)
	assert.NotNil(t, volume(t, m.pod, "rld-socket").EmptyDir)
	require.NotNil(t, m.pod.SecurityContext.FSGroup)
	assert.NotEqual(t, *m.rld.SecurityContext.RunAsUser, *app.SecurityContext.RunAsUser, "the app is another uid")
	assert.Contains(t, app.Env, corev1.EnvVar{Name: "RLD_SOCKET", Value: c.Server.Socket})
	assert.Equal(t, "0660", c.Server.SocketMode, "owner and group only")
}

// TestDaemonSetSocketDir: in daemonset.yaml the socket is in a hostPath
// that the init container hands to the uid and gid rld runs as.
func TestDaemonSetSocketDir(t *testing.T) {
	m := load(t, "daemonset.yaml")
	_, c := m.toml(t)
	hp := volume(t, m.pod, "rld-socket").HostPath
	require.NotNil(t, hp)
	assert.Equal(t, filepath.Dir(c.Server.Socket), hp.Path)
	require.Len(t, m.pod.InitContainers, 1)
	init := m.pod.InitContainers[0]
	assert.Equal(t, hp.Path, mount(t, init, "rld-socket").MountPath)
	sc := m.rld.SecurityContext
	assert.Contains(t, strings.Join(init.Command, " "),
		"chown "+itoa(int32(*sc.RunAsUser))+":"+itoa(int32(*sc.RunAsGroup))+" "+hp.Path)
}
