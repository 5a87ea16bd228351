// Command nexjob-vet runs the durable-code analyzer (package vet/durable)
// as a go vet tool:
//
//	go install github.com/nexjob/nexjob-aws/cmd/nexjob-vet
//	go vet -vettool=$(which nexjob-vet) ./...
//
// Wiring only.
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/nexjob/nexjob-aws/vet/durable"
)

func main() { singlechecker.Main(durable.Analyzer) }
