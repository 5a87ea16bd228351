package durable_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/nexjob/nexjob-aws/vet/durable"
)

// Each mistake the package doc lists is reported where it is, and the
// good code beside it is not (analysistest: every "want" comment must be
// matched, and nothing else reported).
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), durable.Analyzer, "a")
}
