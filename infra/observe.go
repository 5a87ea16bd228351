package infra

import (
	"fmt"
	"strconv"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssqs"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/nexjob/nexjob-aws/metrics"
	"github.com/nexjob/nexjob-aws/settings"
)

// depthAlarm alarms as soon as the queue holds a visible message.
func depthAlarm(c constructs.Construct, queue awssqs.Queue, id, why string) awscloudwatch.Alarm {
	return queue.MetricApproximateNumberOfMessagesVisible(&awscloudwatch.MetricOptions{
		Period: awscdk.Duration_Minutes(jsii.Number(1)), Statistic: jsii.String("Maximum"),
	}).CreateAlarm(c, jsii.String(id), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String(why),
		Threshold:          jsii.Number(0),
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(1),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
}

// metricsViews adds the alarm on the failure rate and the dashboard, over
// the EMF metrics the functions write (package metrics).
func (q *JobQueue) metricsViews(c constructs.Construct, p JobQueueProps) {
	sum := func(name string) awscloudwatch.Metric {
		return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
			Namespace: jsii.String(metrics.DefaultNamespace), MetricName: jsii.String(name),
			Statistic: jsii.String("Sum"), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		})
	}
	rate := awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String("100 * f / (s + f)"), Label: jsii.String("failed %"),
		UsingMetrics: &map[string]awscloudwatch.IMetric{"f": sum(metrics.Failed), "s": sum(metrics.Succeeded)},
		Period:       awscdk.Duration_Minutes(jsii.Number(5)),
	})
	q.FailureRateAlarm = rate.CreateAlarm(c, jsii.String("FailureRate"), &awscloudwatch.CreateAlarmOptions{
		AlarmDescription:   jsii.String("nexjob: more than the threshold's percent of finished jobs Failed (all kinds, 5 minutes)"),
		Threshold:          p.FailureRateAlarm,
		ComparisonOperator: awscloudwatch.ComparisonOperator_GREATER_THAN_THRESHOLD,
		EvaluationPeriods:  jsii.Number(2),
		TreatMissingData:   awscloudwatch.TreatMissingData_NOT_BREACHING,
	})
	perKind := func(name, stat string) awscloudwatch.MathExpression {
		return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
			Expression: jsii.String(fmt.Sprintf("SEARCH('{%s,Kind} MetricName=\"%s\"', '%s', 300)", metrics.DefaultNamespace, name, stat)),
			Label:      jsii.String(name), Period: awscdk.Duration_Minutes(jsii.Number(5)),
		})
	}
	graph := func(title string, ms ...awscloudwatch.IMetric) awscloudwatch.IWidget {
		return awscloudwatch.NewGraphWidget(&awscloudwatch.GraphWidgetProps{Title: jsii.String(title), Left: &ms, Width: jsii.Number(12)})
	}
	q.Dashboard = awscloudwatch.NewDashboard(c, jsii.String("Dashboard"), &awscloudwatch.DashboardProps{
		Widgets: &[]*[]awscloudwatch.IWidget{
			{graph("Succeeded by kind", perKind(metrics.Succeeded, "Sum")), graph("Failed by kind", perKind(metrics.Failed, "Sum"))},
			{graph("Retried by kind", perKind(metrics.Retried, "Sum")), graph("Run duration p95 (ms) by kind", perKind(metrics.RunDuration, "p95"))},
			{graph("Failure rate (%)", rate), graph("Queue age (s), DLQ depth",
				q.Queue.MetricApproximateAgeOfOldestMessage(nil), q.DeadLetterQueue.MetricApproximateNumberOfMessagesVisible(nil))},
		},
	})
}

// webDashboard adds the dashboard's function and its IAM-authenticated URL
// (response streaming, as lambdaurl answers).
func (q *JobQueue) webDashboard(c constructs.Construct, p JobQueueProps, env map[string]*string) {
	wp := p.WebDashboard
	code := wp.Code
	if code == nil {
		code = p.code(settings.Dashboard)
	}
	write := wp.Write != nil && *wp.Write
	env[settings.EnvDashboardWrite] = jsii.String(strconv.FormatBool(write))
	if !write && env[settings.EnvKeySecretParameter] != nil {
		// A read-only role is not given the key secret (GrantRead): with
		// it and the table, a reader could mint what the secret guards.
		delete(env, settings.EnvKeySecretParameter)
		env[settings.EnvKeySecretWithheld] = jsii.String("true")
	}
	q.WebDashboard = newFunction(c, p, "WebDashboard", code, awscdk.Duration_Seconds(jsii.Number(30)), jsii.Number(256), env)
	if write {
		q.GrantOperate(q.WebDashboard)
		q.GrantSignal(q.WebDashboard) // its signal action
	} else {
		q.GrantRead(q.WebDashboard)
	}
	q.WebDashboardURL = q.WebDashboard.AddFunctionUrl(&awslambda.FunctionUrlOptions{
		AuthType:   awslambda.FunctionUrlAuthType_AWS_IAM,
		InvokeMode: awslambda.InvokeMode_RESPONSE_STREAM,
	})
	awscdk.NewCfnOutput(c, jsii.String("WebDashboardUrl"), &awscdk.CfnOutputProps{Value: q.WebDashboardURL.Url()})
}
