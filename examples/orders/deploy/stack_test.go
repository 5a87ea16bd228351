package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/examples/orders/deploy"
	"github.com/nexjob/nexjob-aws/settings"
)

// build cross-compiles one of the app's mains as a Lambda bootstrap.
func build(t *testing.T, pkg string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-o", filepath.Join(dir, "bootstrap"), pkg)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return dir
}

// TestStackRunsTheAppsOwnCode synthesises the orders stack from the app's
// own binaries and checks that every function's code is one of them (byte
// for byte) and that every variable its main reads is set.
func TestStackRunsTheAppsOwnCode(t *testing.T) {
	dirs := deploy.Dirs{Worker: build(t, "./cmd/worker"), Producer: build(t, "./cmd/producer"), Payments: build(t, "./cmd/payments")}
	out := t.TempDir()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(out)})
	deploy.Stack(app, "Orders", dirs)
	app.Synth(nil)

	raw, err := os.ReadFile(filepath.Join(out, "Orders.template.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tpl struct {
		Resources map[string]struct {
			Type       string
			Properties struct {
				Code        struct{ S3Key any }
				Environment struct{ Variables map[string]any }
			}
		}
	}
	if err := json.Unmarshal(raw, &tpl); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for name, dir := range map[string]string{"worker": dirs.Worker, "producer": dirs.Producer, "payments": dirs.Payments} {
		if want[name], err = os.ReadFile(filepath.Join(dir, "bootstrap")); err != nil {
			t.Fatal(err)
		}
	}
	roles := map[settings.Role]bool{}
	for id, r := range tpl.Resources {
		if r.Type != "AWS::Lambda::Function" {
			continue
		}
		key, _ := r.Properties.Code.S3Key.(string)
		code, err := os.ReadFile(filepath.Join(out, "asset."+strings.TrimSuffix(key, ".zip"), "bootstrap"))
		if err != nil {
			t.Fatalf("%s: code %q: %v", id, key, err)
		}
		vars := r.Properties.Environment.Variables
		role := settings.Producer
		binary := "producer"
		if v, ok := vars[settings.EnvRole].(string); ok {
			role, binary = settings.Role(v), "worker"
		}
		if role == settings.Idempotent {
			binary = "payments"
		}
		if !bytes.Equal(code, want[binary]) {
			t.Errorf("%s (%s): its code is not the app's %s binary", id, role, binary)
		}
		for _, v := range settings.Vars(role) {
			if _, ok := vars[v]; !ok {
				t.Errorf("%s (%s): %s is not set", id, role, v)
			}
		}
		roles[role] = true
	}
	for _, r := range []settings.Role{settings.Worker, settings.DeadLetter, settings.Guard, settings.Producer, settings.Idempotent} {
		if !roles[r] {
			t.Errorf("no %s function", r)
		}
	}
}
