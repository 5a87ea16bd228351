// Command app synthesises the orders stack into cdk.out (`go run ./app`;
// `npx aws-cdk@2 deploy --app "go run ./app"` deploys it).
package main

import (
	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/examples/orders/deploy"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String("cdk.out")})
	deploy.Stack(app, "Orders", deploy.Dirs{Worker: "../build/worker", Producer: "../build/producer", Payments: "../build/payments"})
	app.Synth(nil)
}
