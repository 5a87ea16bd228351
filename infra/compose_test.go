package infra_test

import (
	"context"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
)

// TestComposeFile validates ../docker-compose.yml with the compose-spec
// loader (no Docker engine needed) and checks what the README relies on.
func TestComposeFile(t *testing.T) {
	opts, err := cli.NewProjectOptions([]string{"../docker-compose.yml"}, cli.WithWorkingDirectory(".."), cli.WithOsEnv, cli.WithName("nexjob"), cli.WithProfiles([]string{"moto"}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	ls, err := p.GetService("localstack")
	if err != nil {
		t.Fatal(err)
	}
	if ls.Image != "localstack/localstack:4.14.0" {
		t.Errorf("LocalStack image %q, want the pinned 4.14.0", ls.Image)
	}
	for _, port := range ls.Ports {
		if port.HostIP != "127.0.0.1" {
			t.Errorf("port %s published on %q, want 127.0.0.1", port.Published, port.HostIP)
		}
	}
	if ls.HealthCheck == nil || len(ls.HealthCheck.Test) == 0 {
		t.Error("no healthcheck")
	}
	var hooks, sock bool
	for _, v := range ls.Volumes {
		hooks = hooks || strings.HasSuffix(v.Target, "/etc/localstack/init/ready.d")
		sock = sock || v.Target == "/var/run/docker.sock"
	}
	if !hooks || !sock {
		t.Errorf("volumes: init hooks %v, docker socket %v", hooks, sock)
	}
	if _, ok := ls.Environment["LOCALSTACK_AUTH_TOKEN"]; !ok {
		t.Error("LOCALSTACK_AUTH_TOKEN is not passed through")
	}
	moto, err := p.GetService("moto") // the profile service is there with its profile
	if err != nil || !strings.Contains(strings.Join(moto.Profiles, ","), "moto") {
		t.Errorf("moto profile service: %v %v", moto.Profiles, err)
	}
}
