// dra-allocator runs upstream's DRA allocator (k8s.io/dynamic-resource-allocation/structured,
// the code kube-scheduler's DynamicResources plugin runs in Filter for every node it visits)
// over given ResourceSlices, DeviceClasses and ResourceClaim specs, and reports what each
// allocation costs. tests/dra_allocator drives it; scripts/build-k8s.sh dra-allocator builds it.
// Its own module, so that the e2e binaries' cache key does not move with it.
//
// It reads one JSON document (--input FILE, or stdin):
//
//	{"classes": [DeviceClass...],
//	 "nodes": [{"name": "n1", "slices": [ResourceSlice...]}],
//	 "claims": [{"name": "c1", "spec": ResourceClaimSpec}],
//	 "states": [{"node": "n1", "name": "empty", "allocated": ["driver/pool/device", ...]}],
//	 "minRounds": 5, "maxRounds": 200, "minSeconds": 0.2,
//	 "slowSeconds": 0.05, "slowRounds": 3, "timeoutSeconds": 10, "celCacheSize": 10}
//
// and, for every state (a node with some devices already allocated) and every claim, calls
// Allocate(node, [claim]) in rounds: each round calls every claim once, in order, so that load
// from elsewhere falls on all claims alike; at least minRounds rounds, more until minSeconds
// have passed or maxRounds; a claim whose first call took slowSeconds or more is called in
// slowRounds rounds only. Each call has timeoutSeconds, as kube-scheduler's filterTimeout bounds
// one node's Filter. It writes one JSON document on stdout:
//
//	{"allocator": "incubating", "module": "k8s.io/dynamic-resource-allocation v0.37.2",
//	 "features": {...}, "results": [{"node", "state", "claim", "allocated": bool,
//	  "error": "", "timedOut": bool, "calls": n, "medianNs": n, "minNs": n, "cpuMedianNs": n,
//	  "cpuMinNs": n, "steps": n, "devices": [{"request", "driver", "pool", "device"}]}]}
//
// medianNs, minNs: the wall-clock time of a call; cpuMedianNs, cpuMinNs: the CPU time of the
// thread that made it (CLOCK_THREAD_CPUTIME_ID), which leaves out the time it waited for a core
// on a loaded machine (the CPU of background garbage collection is in neither);
// steps: how many times the allocator's depth-first search stepped in one call (its own
// counter, NumAllocateOneInvocations); devices: the first call's allocation.
//
// The features are kube-scheduler v1.37.2's with its default feature gates (read from
// k8s.io/kubernetes v1.37.2 pkg/features/kube_features.go and the plugin's AllocatorFeatures);
// with them NewAllocator picks the "incubating" allocator, as kube-scheduler v1.37.2 does.
// Each claim gets its own CEL cache of celCacheSize entries (kube-scheduler's holds 10 for all
// pods): a claim's expressions are compiled once, as in a scheduler that serves it steadily.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"golang.org/x/sys/unix"
)

// features: kube-scheduler v1.37.2's AllocatorFeatures with the default gates of v1.37:
// DRAAdminAccess GA (locked on), DRAPrioritizedList GA (locked on), DRAPartitionableDevices
// beta (on), DRADeviceTaints GA (on), DRADeviceBindingConditions beta (on) with
// DRAResourceClaimDeviceStatus GA (on), DRAConsumableCapacity beta (on),
// DRAFractionalCapacityRange beta (on); alpha and off: DRAListTypeAttributes,
// DRAOptionalNodeOperations, DRADerivedAttributes, DRADeviceCompatibilityGroups.
var features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
	ListTypeAttributes:      false,
	OptionalNodeOperations:  false,
	DerivedAttributes:       false,
	CompatibilityGroups:     false,
}

// celFeatures: as kube-scheduler's DynamicResources plugin builds its CEL cache.
var celFeatures = cel.Features{
	EnableConsumableCapacity: features.ConsumableCapacity,
	EnableListTypeAttributes: features.ListTypeAttributes,
}

type node struct {
	Name   string                       `json:"name"`
	Slices []*resourceapi.ResourceSlice `json:"slices"`
}

type claim struct {
	Name string                        `json:"name"`
	Spec resourceapi.ResourceClaimSpec `json:"spec"`
}

type state struct {
	Node      string   `json:"node"`
	Name      string   `json:"name"`
	Allocated []string `json:"allocated"`
}

type input struct {
	Classes        []*resourceapi.DeviceClass `json:"classes"`
	Nodes          []node                     `json:"nodes"`
	Claims         []claim                    `json:"claims"`
	States         []state                    `json:"states"`
	MinRounds      int                        `json:"minRounds"`
	MaxRounds      int                        `json:"maxRounds"`
	MinSeconds     float64                    `json:"minSeconds"`
	SlowSeconds    float64                    `json:"slowSeconds"`
	SlowRounds     int                        `json:"slowRounds"`
	TimeoutSeconds float64                    `json:"timeoutSeconds"`
	CELCacheSize   int                        `json:"celCacheSize"`
}

type device struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

type result struct {
	Node        string   `json:"node"`
	State       string   `json:"state"`
	Claim       string   `json:"claim"`
	Allocated   bool     `json:"allocated"`
	Error       string   `json:"error"`
	TimedOut    bool     `json:"timedOut"`
	Calls       int      `json:"calls"`
	MedianNs    int64    `json:"medianNs"`
	MinNs       int64    `json:"minNs"`
	CPUMedianNs int64    `json:"cpuMedianNs"`
	CPUMinNs    int64    `json:"cpuMinNs"`
	Steps       int64    `json:"steps"`
	Devices     []device `json:"devices"`
	durations   []time.Duration
	cpu         []time.Duration
}

type output struct {
	Allocator string              `json:"allocator"`
	Module    string              `json:"module"`
	Features  structured.Features `json:"features"`
	Results   []*result           `json:"results"`
}

// classes is the DeviceClassLister the allocator reads classes from.
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	class, ok := c[name]
	if !ok {
		return nil, fmt.Errorf("deviceclass %q not found", name)
	}
	return class, nil
}

// call reflects on the allocator for what its public interface leaves out (its variant, its
// step counter): methods of the concrete type whose result types are internal to the module.
func call(a structured.Allocator, method string) reflect.Value {
	m := reflect.ValueOf(a).MethodByName(method)
	if !m.IsValid() {
		return reflect.Value{}
	}
	return m.Call(nil)[0]
}

func steps(a structured.Allocator) int64 {
	stats := call(a, "GetStats")
	if !stats.IsValid() {
		return -1
	}
	return stats.FieldByName("NumAllocateOneInvocations").Int()
}

func moduleVersion() string {
	info, ok := debug.ReadBuildInfo()
	if ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/dynamic-resource-allocation" {
				return dep.Path + " " + dep.Version
			}
		}
	}
	return "k8s.io/dynamic-resource-allocation (unknown version)"
}

// defaulted fills in what the API server's defaulting (k8s.io/kubernetes
// pkg/apis/resource/v1, SetDefaults_ExactDeviceRequest, SetDefaults_DeviceSubRequest and the
// generated defaults) gives every stored claim: ExactCount, count 1, toleration operator Equal.
func defaulted(spec *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimSpec {
	mode := func(m *resourceapi.DeviceAllocationMode, count *int64) {
		if *m == "" {
			*m = resourceapi.DeviceAllocationModeExactCount
		}
		if *m == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	tolerations := func(ts []resourceapi.DeviceToleration) {
		for i := range ts {
			if ts[i].Operator == "" {
				ts[i].Operator = resourceapi.DeviceTolerationOpEqual
			}
		}
	}
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			mode(&r.Exactly.AllocationMode, &r.Exactly.Count)
			tolerations(r.Exactly.Tolerations)
		}
		for j := range r.FirstAvailable {
			sub := &r.FirstAvailable[j]
			mode(&sub.AllocationMode, &sub.Count)
			tolerations(sub.Tolerations)
		}
	}
	return spec
}

// threadCPU is the CPU time of the calling OS thread (the measuring goroutine is locked to it):
// what a call costs in CPU, apart from time the thread waited for a core on a loaded machine.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func deviceID(s string) (structured.DeviceID, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return structured.DeviceID{}, fmt.Errorf("allocated device %q: want driver/pool/device", s)
	}
	return structured.MakeDeviceID(parts[0], parts[1], parts[2]), nil
}

func main() {
	path := flag.String("input", "-", "the JSON input (- for stdin)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "dra-allocator:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*path, os.Stdout); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "dra-allocator:", err)
		os.Exit(1)
	}
}

func run(path string, w io.Writer) error {
	runtime.LockOSThread() // threadCPU measures this goroutine's calls
	defer runtime.UnlockOSThread()
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return err
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	defaults(&in)
	lister := classes{}
	for _, c := range in.Classes {
		lister[c.Name] = c
	}
	nodes := map[string]node{}
	for _, n := range in.Nodes {
		nodes[n.Name] = n
	}
	caches := make([]*cel.Cache, len(in.Claims))
	for i := range caches {
		caches[i] = cel.NewCache(in.CELCacheSize, celFeatures)
	}
	out := output{Module: moduleVersion(), Features: features}
	for _, st := range in.States {
		n, ok := nodes[st.Node]
		if !ok {
			return fmt.Errorf("state %s: no node %q", st.Name, st.Node)
		}
		results, variant, err := measure(in, lister, caches, n, st)
		if err != nil {
			return fmt.Errorf("node %s, state %s: %w", n.Name, st.Name, err)
		}
		out.Allocator = variant
		out.Results = append(out.Results, results...)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(out)
}

func minMedian(durations []time.Duration) (int64, int64) {
	sorted := append([]time.Duration(nil), durations...)
	sort.Slice(sorted, func(a, b int) bool { return sorted[a] < sorted[b] })
	return sorted[0].Nanoseconds(), sorted[len(sorted)/2].Nanoseconds()
}

func defaults(in *input) {
	if in.MinRounds <= 0 {
		in.MinRounds = 5
	}
	if in.MaxRounds < in.MinRounds {
		in.MaxRounds = max(in.MinRounds, 200)
	}
	if in.SlowSeconds <= 0 {
		in.SlowSeconds = 0.05
	}
	if in.SlowRounds <= 0 {
		in.SlowRounds = 3
	}
	if in.TimeoutSeconds <= 0 {
		in.TimeoutSeconds = 10 // kube-scheduler's default filterTimeout
	}
	if in.CELCacheSize <= 0 {
		in.CELCacheSize = 10 // kube-scheduler's
	}
}

// measure calls every claim on one node in one state, in rounds.
func measure(in input, lister classes, caches []*cel.Cache, n node, st state) ([]*result, string, error) {
	ctx := context.Background()
	allocated := sets.New[structured.DeviceID]()
	for _, s := range st.Allocated {
		id, err := deviceID(s)
		if err != nil {
			return nil, "", err
		}
		allocated.Insert(id)
	}
	allocatedState := structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	kubeNode := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}}}
	allocators := make([]structured.Allocator, len(in.Claims))
	claims := make([]*resourceapi.ResourceClaim, len(in.Claims))
	results := make([]*result, len(in.Claims))
	variant := ""
	for i, c := range in.Claims {
		a, err := structured.NewAllocator(ctx, features, allocatedState, lister, n.Slices, caches[i])
		if err != nil {
			return nil, "", err
		}
		allocators[i] = a
		if v := call(a, "Channel"); v.IsValid() {
			variant = v.String()
		}
		claims[i] = &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{
				Name: c.Name, Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", i)),
			},
			Spec: *defaulted(c.Spec.DeepCopy()),
		}
		results[i] = &result{Node: n.Name, State: st.Name, Claim: c.Name}
	}
	timeout := time.Duration(in.TimeoutSeconds * float64(time.Second))
	slow := time.Duration(in.SlowSeconds * float64(time.Second))
	start := time.Now()
	for round := 0; round < in.MaxRounds; round++ {
		if round >= in.MinRounds && time.Since(start).Seconds() >= in.MinSeconds {
			break
		}
		for i := range claims {
			r := results[i]
			if round > 0 && (r.Error != "" || r.TimedOut) {
				continue // an error or a timeout is the answer; once is enough
			}
			if round >= in.SlowRounds && len(r.durations) > 0 && r.durations[0] >= slow {
				continue
			}
			before := steps(allocators[i])
			callCtx, cancel := context.WithTimeout(ctx, timeout)
			c0, t0 := threadCPU(), time.Now()
			got, err := allocators[i].Allocate(callCtx, kubeNode, []*resourceapi.ResourceClaim{claims[i]})
			took, cpu := time.Since(t0), threadCPU()-c0
			cancel()
			r.durations = append(r.durations, took)
			r.cpu = append(r.cpu, cpu)
			if round == 0 {
				r.Steps = steps(allocators[i]) - before
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					r.TimedOut = true
				case err != nil:
					r.Error = err.Error()
				case len(got) == 1:
					r.Allocated = true
					for _, d := range got[0].Devices.Results {
						r.Devices = append(r.Devices, device{d.Request, d.Driver, d.Pool, d.Device})
					}
				}
			}
		}
	}
	for _, r := range results {
		r.Calls = len(r.durations)
		r.MinNs, r.MedianNs = minMedian(r.durations)
		r.CPUMinNs, r.CPUMedianNs = minMedian(r.cpu)
	}
	return results, variant, nil
}
