// Command deviceplugin_client calls Allocate on device plugins the way the kubelet does: a Go
// gRPC client on the plugin's unix socket. bench/deviceplugin.py builds it at bench time
// inside the Go device plugin's module (which requires k8s.io/kubelet and grpc already) and
// gives it both plugins' sockets, so both are measured by the same client, in the same rounds.
//
//	deviceplugin_client -n 2000 SOCKET...
//
// For each socket it reads the first ListAndWatch reply, takes its first device, then calls
// Allocate for that device and GetDevicePluginOptions (no work: the floor of that server) n
// times each (after a warm-up), one of each per socket per round, and prints
// {"SOCKET": {"p50_ms": .., "p99_ms": .., "floor_p50_ms": .., "floor_p99_ms": .., "calls": n}}
// as JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type target struct {
	socket string
	client pluginapi.DevicePluginClient
	device string
	ms     []float64
	floor  []float64
}

func connect(socket string) (*target, error) {
	conn, err := grpc.Dial("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	reply, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if len(reply.Devices) == 0 {
		return nil, fmt.Errorf("%s: no devices", socket)
	}
	return &target{socket: socket, client: client, device: reply.Devices[0].ID}, nil
}

func (t *target) allocate() (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	request := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIDs: []string{t.device}},
	}}
	start := time.Now()
	_, err := t.client.Allocate(ctx, request)
	return float64(time.Since(start).Nanoseconds()) / 1e6, err
}

func (t *target) options() (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := t.client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	return float64(time.Since(start).Nanoseconds()) / 1e6, err
}

func percentile(sorted []float64, p float64) float64 {
	return sorted[int(p*float64(len(sorted)-1)+0.5)]
}

func main() {
	calls := flag.Int("n", 2000, "Allocate calls per socket")
	warmup := flag.Int("warmup", 100, "calls per socket before measuring")
	flag.Parse()
	var targets []*target
	for _, socket := range flag.Args() {
		t, err := connect(socket)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		targets = append(targets, t)
	}
	for i := 0; i < *warmup+*calls; i++ {
		for _, t := range targets {
			ms, err := t.allocate()
			floor, ferr := t.options()
			if err == nil {
				err = ferr
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", t.socket, err)
				os.Exit(1)
			}
			if i >= *warmup {
				t.ms = append(t.ms, ms)
				t.floor = append(t.floor, floor)
			}
		}
	}
	out := map[string]map[string]float64{}
	for _, t := range targets {
		sort.Float64s(t.ms)
		sort.Float64s(t.floor)
		out[t.socket] = map[string]float64{
			"p50_ms": percentile(t.ms, 0.50), "p99_ms": percentile(t.ms, 0.99),
			"floor_p50_ms": percentile(t.floor, 0.50), "floor_p99_ms": percentile(t.floor, 0.99),
			"calls": float64(len(t.ms)),
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
