package nexjobtest

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestInstallShowsProgress (issue 30, item 4): while pip installs the
// emulator, its lines reach the terminal as they come ("Collecting …"),
// so a first go test shows an install going on instead of nothing for
// minutes; everything pip said is kept for an error.
func TestInstallShowsProgress(t *testing.T) {
	var said []string
	old := notice
	notice = func(msg string) { said = append(said, msg) }
	t.Cleanup(func() { notice = old })
	var all bytes.Buffer
	p := &progress{out: &all}
	pip := "Collecting moto==5.2.5 (from -r req (line 1))\n  Downloading moto-5.2.5-py3-none-any.whl (4.5 MB)\nCollecting boto3\nInstalling collected packages: boto3, moto\nSuccessfully installed boto3-1.0 moto-5.2.5\n"
	for i := 0; i < len(pip); i += 7 { // in pieces, as a pipe delivers them
		if _, err := fmt.Fprint(p, pip[i:min(i+7, len(pip))]); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"nexjobtest: pip: Collecting moto==5.2.5 (from -r req (line 1))", "nexjobtest: pip: Collecting boto3",
		"nexjobtest: pip: Installing collected packages: boto3, moto", "nexjobtest: pip: Successfully installed boto3-1.0 moto-5.2.5"}
	if strings.Join(said, "\n") != strings.Join(want, "\n") {
		t.Fatalf("progress said:\n%s\nwant:\n%s", strings.Join(said, "\n"), strings.Join(want, "\n"))
	}
	if all.String() != pip {
		t.Fatalf("kept %q; want all of pip's output", all.String())
	}
}
