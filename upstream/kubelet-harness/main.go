// kubelet-harness runs the kubelet's own device manager (pkg/kubelet/cm/devicemanager) and
// Topology Manager (pkg/kubelet/cm/topologymanager) outside a kubelet, so that real device
// plugins register with it and pods are admitted exactly as a kubelet would admit them.
//
// One process holds any number of nodes, each its own device manager and Topology Manager
// serving the device plugin Registration service on <pluginDir>/kubelet.sock (plugins register
// there and are dialled back). It reads one JSON request per line on stdin and answers one JSON
// line on stdout ("node" names the node every request but "start" is for):
//
//	{"op":"start","node":"n1","pluginDir":"/tmp/x","numa":[0,1],"policy":"restricted",
//	 "scope":"container","policyOptions":{}}
//	    a new node; answers {"started":"n1"}
//	{"op":"wait","resources":{"nvidia.com/gpu":8},"timeoutSeconds":60}
//	    until the device manager has that many devices of each resource registered, healthy
//	    or not (its node capacity); answers {"devices":{resource:{id:[numa...]}}} (the
//	    topology the plugins reported for the healthy ones)
//	{"op":"admit","pod":{...v1.Pod...}}
//	    the Topology Manager's admission, which also allocates (GetPreferredAllocation and
//	    Allocate are called on the plugins as the kubelet calls them); answers
//	    {"uid","admitted","reason","message","containers":[{"name","kind","affinity",
//	    "preferred","devices":{resource:[ids]},"env":{name:value}}]} (env: what the device
//	    manager gives the container from the plugins' Allocate answers, when admitted)
//	{"op":"delete","uid":"..."}
//	    the pod stops being active: its devices go back, as when a kubelet's pod terminates
//
// A request that cannot be read is answered {"error":"..."}; the harness carries on.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	_ "unsafe" // go:linkname below

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// newManagerImpl is what devicemanager.NewManagerImpl calls with the hard-coded
// /var/lib/kubelet/device-plugins/kubelet.sock; reaching it directly lets the harness serve on a
// temporary folder with no privileges (no mount namespace, no root).
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node,
	store topologymanager.Store) (*devicemanager.ManagerImpl, error)

type request struct {
	Op             string            `json:"op"`
	Node           string            `json:"node"`
	Pod            *v1.Pod           `json:"pod,omitempty"`
	UID            string            `json:"uid,omitempty"`
	Resources      map[string]int    `json:"resources,omitempty"`
	TimeoutSeconds float64           `json:"timeoutSeconds,omitempty"`
	PluginDir      string            `json:"pluginDir,omitempty"`
	NUMA           []int             `json:"numa,omitempty"`
	Policy         string            `json:"policy,omitempty"`
	Scope          string            `json:"scope,omitempty"`
	PolicyOptions  map[string]string `json:"policyOptions,omitempty"`
}

type containerResult struct {
	Name      string              `json:"name"`
	Kind      string              `json:"kind"` // init | sidecar | app
	Affinity  []int               `json:"affinity"`
	Preferred bool                `json:"preferred"`
	Devices   map[string][]string `json:"devices"`
	Env       map[string]string   `json:"env"`
}

type admitResult struct {
	UID        string            `json:"uid"`
	Admitted   bool              `json:"admitted"`
	Reason     string            `json:"reason,omitempty"`
	Message    string            `json:"message,omitempty"`
	Containers []containerResult `json:"containers"`
}

type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

type harness struct {
	logger klog.Logger
	dm     *devicemanager.ManagerImpl
	tm     topologymanager.Manager

	mu        sync.Mutex
	active    []*v1.Pod
	admitting *v1.Pod
}

// activePods is what the kubelet's GetActivePods gives the device manager: the admitted pods and
// the one being admitted (HandlePodAdditions adds a pod to the pod manager before admitting it).
// Devices of any other pod are freed the next time the device manager looks.
func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	pods := append([]*v1.Pod(nil), h.active...)
	if h.admitting != nil {
		pods = append(pods, h.admitting)
	}
	return pods
}

func (h *harness) admit(pod *v1.Pod) (admitResult, error) {
	if pod.UID == "" {
		return admitResult{}, fmt.Errorf("pod %s/%s: metadata.uid is required", pod.Namespace, pod.Name)
	}
	for _, p := range h.activePods() {
		if p.UID == pod.UID {
			return admitResult{}, fmt.Errorf("pod uid %s is already active", pod.UID)
		}
	}
	others := h.activePods()
	h.mu.Lock()
	h.admitting = pod
	h.mu.Unlock()
	result := h.tm.Admit(context.Background(), &lifecycle.PodAdmitAttributes{
		Pod: pod, OtherPods: others, Operation: lifecycle.AddOperation,
	})
	h.mu.Lock()
	h.admitting = nil
	if result.Admit {
		h.active = append(h.active, pod)
	}
	h.mu.Unlock()
	out := admitResult{UID: string(pod.UID), Admitted: result.Admit, Reason: result.Reason, Message: result.Message}
	for _, c := range pod.Spec.InitContainers {
		kind := "init"
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			kind = "sidecar"
		}
		r, err := h.container(pod, &c, kind, result.Admit)
		if err != nil {
			return out, err
		}
		out.Containers = append(out.Containers, r)
	}
	for _, c := range pod.Spec.Containers {
		r, err := h.container(pod, &c, "app", result.Admit)
		if err != nil {
			return out, err
		}
		out.Containers = append(out.Containers, r)
	}
	return out, nil
}

func (h *harness) container(pod *v1.Pod, c *v1.Container, kind string, admitted bool) (containerResult, error) {
	name := c.Name
	hint := h.tm.GetAffinity(h.logger, string(pod.UID), name)
	r := containerResult{Name: name, Kind: kind, Preferred: hint.Preferred, Devices: map[string][]string{}, Env: map[string]string{}}
	if hint.NUMANodeAffinity != nil {
		r.Affinity = hint.NUMANodeAffinity.GetBits()
	}
	for resource, devices := range h.dm.GetDevices(string(pod.UID), name) {
		ids := make([]string, 0, len(devices))
		for id := range devices {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		r.Devices[resource] = ids
	}
	if !admitted {
		return r, nil
	}
	opts, err := h.dm.GetDeviceRunContainerOptions(context.Background(), pod, c)
	if err != nil {
		return r, fmt.Errorf("container %s: run options: %w", name, err)
	}
	if opts != nil {
		for _, e := range opts.Envs {
			r.Env[e.Name] = e.Value
		}
	}
	return r, nil
}

func (h *harness) delete(uid string) error {
	h.mu.Lock()
	kept := h.active[:0]
	found := false
	for _, p := range h.active {
		if string(p.UID) == uid {
			found = true
			continue
		}
		kept = append(kept, p)
	}
	h.active = kept
	h.mu.Unlock()
	if !found {
		return fmt.Errorf("no active pod with uid %s", uid)
	}
	h.dm.UpdateAllocatedDevices(h.logger) // what the kubelet does lazily before the next admission
	return nil
}

// devices: every healthy device the plugins reported, with its NUMA nodes.
func (h *harness) devices() map[string]map[string][]int {
	out := map[string]map[string][]int{}
	for resource, devices := range h.dm.GetAllocatableDevices(h.logger) {
		out[resource] = map[string][]int{}
		for id, d := range devices {
			numa := []int{}
			if d.Topology != nil {
				for _, n := range d.Topology.Nodes {
					numa = append(numa, int(n.ID))
				}
			}
			out[resource][id] = numa
		}
	}
	return out
}

func (h *harness) wait(want map[string]int, timeout time.Duration) (map[string]map[string][]int, error) {
	deadline := time.Now().Add(timeout)
	for {
		capacity, _, _ := h.dm.GetCapacity(h.logger)
		missing := []string{}
		for resource, n := range want {
			registered := capacity[v1.ResourceName(resource)]
			if got := registered.Value(); got < int64(n) {
				missing = append(missing, fmt.Sprintf("%s: %d of %d", resource, got, n))
			}
		}
		if len(missing) == 0 {
			return h.devices(), nil
		}
		if time.Now().After(deadline) {
			sort.Strings(missing)
			return nil, fmt.Errorf("timed out after %s waiting for devices (%s)", timeout, strings.Join(missing, ", "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodes: every node this process holds, by name.
type nodes struct {
	logger klog.Logger
	byName map[string]*harness
}

func errorReply(format string, args ...any) map[string]string {
	return map[string]string{"error": fmt.Sprintf(format, args...)}
}

func (n *nodes) handle(line []byte) any {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return errorReply("request: %v", err)
	}
	if req.Op == "start" {
		return n.start(req)
	}
	h, ok := n.byName[req.Node]
	if !ok {
		return errorReply("%s: no node %q (start it first)", req.Op, req.Node)
	}
	switch req.Op {
	case "admit":
		if req.Pod == nil {
			return errorReply("admit: pod is required")
		}
		result, err := h.admit(req.Pod)
		if err != nil {
			return errorReply("admit: %v", err)
		}
		return result
	case "delete":
		if err := h.delete(req.UID); err != nil {
			return errorReply("delete: %v", err)
		}
		return map[string]string{"deleted": req.UID}
	case "wait":
		timeout := time.Duration(req.TimeoutSeconds * float64(time.Second))
		if timeout <= 0 {
			timeout = time.Minute
		}
		devices, err := h.wait(req.Resources, timeout)
		if err != nil {
			return errorReply("wait: %v", err)
		}
		return map[string]any{"devices": devices}
	default:
		return errorReply("unknown op %q (start, admit, delete, wait)", req.Op)
	}
}

func (n *nodes) start(req request) any {
	if _, taken := n.byName[req.Node]; taken {
		return errorReply("start: node %q exists", req.Node)
	}
	if !filepath.IsAbs(req.PluginDir) {
		return errorReply("start: pluginDir %q must be an absolute path", req.PluginDir)
	}
	if len(req.NUMA) == 0 {
		return errorReply("start: numa must list the machine's NUMA node ids")
	}
	topology := make([]cadvisorapi.Node, 0, len(req.NUMA))
	for _, id := range req.NUMA {
		topology = append(topology, cadvisorapi.Node{Id: id})
	}
	h, err := start(n.logger, req.PluginDir, topology, req.Policy, req.Scope, req.PolicyOptions)
	if err != nil {
		return errorReply("start: %v", err)
	}
	n.byName[req.Node] = h
	return map[string]string{"started": req.Node}
}

func start(logger klog.Logger, pluginDir string, numa []cadvisorapi.Node, policy, scope string, options map[string]string) (*harness, error) {
	tm, err := topologymanager.NewManager(logger, numa, policy, scope, options)
	if err != nil {
		return nil, fmt.Errorf("topology manager: %w", err)
	}
	dm, err := newManagerImpl(logger, filepath.Join(pluginDir, "kubelet.sock"), numa, tm)
	if err != nil {
		return nil, fmt.Errorf("device manager: %w", err)
	}
	h := &harness{logger: logger, dm: dm, tm: tm}
	tm.AddHintProvider(logger, dm)
	if err := dm.Start(logger, h.activePods, allSourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return nil, fmt.Errorf("device manager start: %w", err)
	}
	return h, nil
}

func main() {
	klog.InitFlags(nil)
	flag.Parse()
	n := &nodes{logger: klog.Background(), byName: map[string]*harness{}}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]bool{"ready": true}); err != nil {
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		if len(strings.TrimSpace(in.Text())) == 0 {
			continue
		}
		if err := out.Encode(n.handle(in.Bytes())); err != nil {
			os.Exit(1)
		}
	}
	code := 0
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-harness: stdin:", err)
		code = 1
	}
	for _, h := range n.byName {
		_ = h.dm.Stop(n.logger)
	}
	os.Exit(code)
}
