// Package infra will hold the CDK construct (NewJobQueue) and app. It is
// its own module so that no runtime binary links jsii or the CDK.
package infra
